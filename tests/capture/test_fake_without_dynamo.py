"""Capture's fake tensors do not import Dynamo (tempa/capture/fake.py), and leave nothing
behind that changes Dynamo for a torch.compile later in the process. Each case runs in a
fresh interpreter: whether Dynamo is imported is a per-process fact."""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       env=env, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def test_autocast_capture_runs_fake_tensors_without_importing_dynamo():
    out = _run("""
        import sys, tempfile, os
        os.environ["TEMPA_CACHE_DIR"] = tempfile.mkdtemp()
        import torch
        import tempa
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
        from tests.models.gpt import GPT, GPTConfig

        class Autocast(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m
            def forward(self, idx, tgt):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits, loss = self.m(idx, tgt)
                    # logsumexp has no rule under autocast (meta.py): fake tensors answer
                    return logits.logsumexp(-1), loss

        torch.manual_seed(0)
        model = Autocast(GPT(GPTConfig(vocab_size=128, block_size=32, n_layer=1, n_head=2, n_embd=32)))
        idx = torch.randint(0, 128, (2, 16)); tgt = torch.randint(0, 128, (2, 16))
        graphs = []
        def keep(gm, example_inputs):
            graphs.append(gm)
            return gm.forward
        logits, loss = tempa.compile(model, backend=keep)(idx, tgt)
        ref_logits, ref_loss = model(idx, tgt)
        fakes = sum(isinstance(n.meta.get("example_value"), FakeTensor) for n in graphs[0].graph.nodes)
        dispatch = vars(FakeTensorMode)["__torch_dispatch__"].__wrapped__
        print("fakes", fakes)
        print("dynamo", "torch._dynamo" in sys.modules, "_dynamo" in vars(torch),
              "__dynamo_disable" in vars(dispatch))
        print("same", torch.equal(loss, ref_loss), logits.dtype == ref_logits.dtype)
        print("compile", torch.compile(lambda x: x.sin() + 1, backend="eager")(torch.ones(2)).tolist())
    """)
    lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
    assert int(lines["fakes"]) > 0               # autocast ops ran on fake tensors
    assert lines["dynamo"] == "False False False"
    assert lines["same"] == "True True"
    assert lines["compile"].startswith("[1.84")   # Dynamo, imported after, works


def test_dynamo_submodule_imported_in_the_block_is_the_packages_own():
    out = _run("""
        import gc, sys, torch
        from tempa.capture.fake import without_dynamo_import
        with without_dynamo_import():
            from torch._dynamo.source import LocalSource
            import torch._dynamo.utils as utils
        import torch._dynamo
        copies = [o for o in gc.get_objects() if isinstance(o, type) and o.__name__ == "LocalSource"]
        print(len(copies), torch._dynamo.source.LocalSource is LocalSource, torch._dynamo.utils is utils,
              type(sys.modules["torch._dynamo.source"].__spec__.loader).__name__)
        print(torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1)).tolist())
    """)
    first, second = out.strip().splitlines()
    assert first == "1 True True SourceFileLoader"
    assert second == "[2.0]"
