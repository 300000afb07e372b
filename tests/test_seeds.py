"""The seeds' examples, verbatim with `tempa` in place of `torch.compile` (and
`tempa.explain` in place of `torch._dynamo.explain`), print what the seeds print."""
import torch
import torch.nn as nn

import tempa


def test_seed_000_basic_usage(capsys):
    class JaringanKecil(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(32, 64)
            self.fc2 = nn.Linear(64, 10)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    torch.manual_seed(42)
    model = JaringanKecil()
    model_kompilasi = tempa.compile(model)
    print("Tipe hasil torch.compile :", type(model_kompilasi).__name__)
    x = torch.randn(8, 32)
    y_eager = model(x)
    y_kompilasi = model_kompilasi(x)  # panggilan pertama: kompilasi berlangsung di sini
    print("Keluaran sama (atol 1e-5):", torch.allclose(y_eager, y_kompilasi, atol=1e-5))
    assert capsys.readouterr().out == (
        "Tipe hasil torch.compile : OptimizedModule\n"
        "Keluaran sama (atol 1e-5): True\n")


def test_seed_000_graph_break_explain(capsys):
    class JaringanPutus(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(32, 64)
            self.fc2 = nn.Linear(64, 10)

        def forward(self, x):
            y = torch.relu(self.fc1(x))
            if y.sum() > 0:  # cabang bergantung pada nilai tensor
                y = y * 1.0
            return self.fc2(y)

    torch.manual_seed(0)
    model = JaringanPutus()
    x = torch.randn(4, 32)
    laporan = tempa.explain(model)(x)
    print("Jumlah graf :", laporan.graph_count)
    print("Graph break :", laporan.graph_break_count)
    print("Jumlah operasi:", laporan.op_count)
    assert capsys.readouterr().out == (
        "Jumlah graf : 2\n"
        "Graph break : 1\n"
        "Jumlah operasi: 5\n")


def test_seed_000_modes_do_not_change_results():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    expected = model(x)
    for mode in ("default", "reduce-overhead", "max-autotune"):
        tempa.reset()
        out = tempa.compile(model, mode=mode)(x)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_seed_002_usage_lines():
    class ReteaTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)

        def forward(self, x):
            return self.layer(x)

    torch.manual_seed(0)
    model = ReteaTransformer().eval()
    intrari = torch.randn(2, 5, 32)
    # Compilarea modelului pentru accelerare maximă pe GPU (PyTorch 2.0+):
    model_optimizat = tempa.compile(model, mode="reduce-overhead")
    # Prima rulare face compilarea JIT, următoarele vor rula la viteză maximă:
    iesiri = model_optimizat(intrari)
    torch.testing.assert_close(iesiri, model(intrari), rtol=1e-4, atol=1e-4)

    # Dezactivarea compilării pe o funcție problematică: decoreaz-o cu @tempa.disable.
    @tempa.disable
    def problematica(t):
        return t.numpy().sum()

    def f(t):
        return t * problematica(t)

    compiled = tempa.compile(f)                  # fullgraph=False: breaks around it
    t = torch.ones(3)
    torch.testing.assert_close(compiled(t), f(t))
