"""tempa's backend: a torch-level FX graph in, a compiled callable out.

Contract (the same as torch.compile's custom backends): ``tempa_backend(gm, example_inputs)``
returns a callable taking the graph's inputs positionally and returning what ``gm`` returns.
"""
