"""Training steps of an eager model and its compiled twin, run side by side (the optimizer
tests of tests/capture and tests/backend)."""


def step_twins(twins, x, steps: int, loss=lambda out: out.pow(2).mean()):
    """``steps`` training steps of each ``(model, optimizer, step)`` in ``twins`` on the
    input ``x``, interleaved step by step: ``loss(model(x)).backward()``, then ``step()``
    (the optimizer's step, eager or compiled), then ``optimizer.zero_grad()``."""
    for _ in range(steps):
        for model, optimizer, step in twins:
            loss(model(x)).backward()
            step()
            optimizer.zero_grad()
