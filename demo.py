"""torchcond in six steps: eager, export with a dynamic batch, print, save/load, both
branches, and a portable program loaded and run in a process without torchcond.

Run with `make demo`.
"""

import io
import os
import subprocess
import sys
import tempfile

import torch
from torch.export import Dim, export

from torchcond import cond, switch
from torchcond.passes import portable

# Run in a fresh process: load the saved program and check that torchcond was never imported.
WITHOUT_TORCHCOND = """
import sys, torch
module = torch.export.load(sys.argv[1]).module()
inputs, expected = torch.load(sys.argv[2])
for (x, mode), want in zip(inputs, expected):
    assert torch.allclose(module(x, mode), want)
assert "torchcond" not in sys.modules
print(f"   {len(inputs)} calls match eager; torchcond imported: {'torchcond' in sys.modules}")
"""


class Gate(torch.nn.Module):
    """Small batches go through a linear layer, large ones through a cheap path."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.full((4,), 0.5))

    def forward(self, x, mode):
        y = cond(
            x.shape[0] <= 8,
            lambda x: torch.relu(self.proj(x)),
            lambda x: x * self.scale,
            (x,),
        )
        return switch(mode, [lambda y: y, lambda y: y.cumsum(0), lambda y: y.flip(0)], (y,))


def main():
    torch.manual_seed(0)
    model = Gate().eval()
    x, mode = torch.randn(6, 4), torch.tensor(1)

    print("1. eager: cond/switch run like a Python `if` (only the taken branch)")
    print(model(x, mode))

    print("\n2. export with a dynamic batch dimension (the shape predicate stays symbolic)")
    batch = Dim("batch", min=2, max=1024)
    ep = export(model, (x, mode), dynamic_shapes=({0: batch}, None))
    print("range constraints:", ep.range_constraints)

    print("\n3. print_readable(): one torchcond_cond and one torchcond_switch node")
    ep.graph_module.print_readable()

    print("4. save / load round trip")
    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer).module()

    print("\n5. the loaded program on new shapes takes both branches")
    with torch.no_grad():
        for n, m in [(3, 0), (500, 1), (8, 2), (9, 7)]:
            xi, mi = torch.randn(n, 4), torch.tensor(m)
            got, want = loaded(xi, mi), model(xi, mi)
            branch = "linear+relu" if n <= 8 else "scale"
            same = torch.allclose(got, want)
            print(
                f"   batch={n:4d} mode={m}: cond took {branch:11s} switch took {min(m, 2)}  matches eager: {same}"
            )
            assert same

    print("\n6. portable(ep): torch.ops.higher_order.cond only, run in a process without torchcond")
    shipped = portable(ep)
    print(
        "   operators:",
        sorted({str(n.target) for n in shipped.graph.nodes if n.op == "call_function"}),
    )
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        program, data = os.path.join(tmp, "gate.pt2"), os.path.join(tmp, "inputs.pt")
        torch.export.save(shipped, program)
        inputs = [(torch.randn(n, 4), torch.tensor(m)) for n, m in [(3, 0), (500, 1), (9, 7)]]
        torch.save((inputs, [model(x, m) for x, m in inputs]), data)
        subprocess.run([sys.executable, "-c", WITHOUT_TORCHCOND, program, data], check=True)


if __name__ == "__main__":
    main()
