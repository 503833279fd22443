"""The layout's promises: a framework-neutral core, no import cycles, the two ends of the wire apart."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NEUTRAL = ("core", "wire", "producers", "consumers", "profiler", "runner", "harness", "benchmarks")
# Benchmarks of the TensorFlow op itself import TensorFlow by definition.
FRAMEWORK_BENCHMARKS = {"benchmarks.bench_op"}
# Checks that drive a framework's own code by design (a GPU self-check, a trainer's overhead), named here.
FRAMEWORK_AWARE: set[str] = set()
PACKAGES = (*NEUTRAL, "feeders", "frameworks", "models", "zmq_ops")
# The framework halves inside the neutral folders: each input path's `tf.py` and `torch.py`, what several
# halves of one framework share (consumers/tf_*.py, consumers/torch_*.py), and the two trainers (harness/tf/,
# harness/torch/), the harness's framework plugins. Everything else in NEUTRAL is framework-free.
TF_HALF = re.compile(r"^(consumers\.[a-z0-9_]+\.tf|consumers\.tf_[a-z0-9_]+|harness\.tf(\..+)?)$")
TORCH_HALF = re.compile(r"^(consumers\.[a-z0-9_]+\.torch|consumers\.torch_[a-z0-9_]+|harness\.torch(\..+)?)$")


def is_half(module: str) -> bool:
    return bool(TF_HALF.match(module) or TORCH_HALF.match(module))


def modules(packages, halves: bool = True, root: Path = ROOT) -> list[str]:
    out = []
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            rel = f.relative_to(root).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            name = ".".join(parts)
            if halves or not is_half(name):
                out.append(name)
    return out


def test_the_neutral_packages_import_neither_tensorflow_nor_torch():
    names = [m for m in modules(NEUTRAL, halves=False) if m not in FRAMEWORK_BENCHMARKS and not m.endswith("__main__")]
    code = (
        "import importlib, sys\n"
        f"for m in {names!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'torch', 'tensorpack'})\n"
        "print(' '.join(bad))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "", f"a neutral module imports {p.stdout.strip()}"
    assert len(names) > 30


def string_imports(tree: ast.AST) -> list[str]:
    """Modules imported by a name written as a string: `importlib.import_module("x")`, `__import__("x")`, or
    through a module-level constant that holds it (`HALVES = "x"` ... `import_module(HALVES)`)."""
    constants = {
        t.id: node.value.value
        for node in getattr(tree, "body", [])
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        f, arg = node.func, node.args[0]
        called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if called not in ("import_module", "__import__"):
            continue
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            found.append(arg.value)
        elif isinstance(arg, ast.Name) and arg.id in constants:
            found.append(constants[arg.id])
    return found


def source_of(module: str, root: Path = ROOT) -> ast.AST:
    path = root / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = root / module.replace(".", "/") / "__init__.py"
    return ast.parse(path.read_text())


def imports_of(module: str, root: Path = ROOT) -> set[str]:
    """Project modules `module` imports anywhere in its file (inside functions too, and by a name written as a
    string: a hidden cycle is a cycle)."""
    known = set(modules(PACKAGES, root=root)) | {"bench_input"}
    tree = source_of(module, root)
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import mod` imports pkg.mod; `from pkg import name` imports pkg itself.
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names
            ]
        found |= {n for n in names if n in known and n != module}
    return found | {n for n in string_imports(tree) if n in known and n != module}


def import_cycle(root: Path = ROOT) -> str | None:
    """The first import cycle among the project's modules under `root`, as `a -> b -> a`; None without one."""
    graph = {m: imports_of(m, root) for m in [*modules(PACKAGES, root=root), "bench_input"]}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> str | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return " -> ".join(stack[stack.index(n) :] + [n])
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_project_modules_import_each_other_without_cycles():
    cycle = import_cycle()
    assert cycle is None, f"import cycle: {cycle}"


PLANTED = {
    "literal": '    return importlib.import_module("consumers.declared").load(framework)\n',
    "constant": "    return importlib.import_module(HALVES).load(framework)\n\n\nHALVES = 'consumers.declared'\n",
}


@pytest.mark.parametrize("planted", PLANTED)
def test_a_string_import_that_closes_a_cycle_is_caught(tmp_path, planted):
    """core/ importing consumers/ by a name in a string (importlib) is the loop back up the rule exists for."""
    import shutil

    for item in [*PACKAGES, "bench_input.py"]:
        src = ROOT / item
        if src.is_dir():
            shutil.copytree(src, tmp_path / item, ignore=shutil.ignore_patterns("*.so", "build", "__pycache__"))
        else:
            shutil.copy(src, tmp_path / item)
    assert import_cycle(tmp_path) is None
    registry = tmp_path / "core" / "registry.py"
    registry.write_text(
        registry.read_text() + "\n\ndef planted(framework):\n" + "    import importlib\n\n" + PLANTED[planted]
    )
    cycle = import_cycle(tmp_path)
    assert cycle is not None and "core.registry" in cycle and "consumers.declared" in cycle, cycle


def test_the_two_ends_of_the_wire_do_not_import_each_other():
    for a, b in (("consumers", "producers"), ("producers", "consumers")):
        for m in modules([a]):
            bad = [n for n in imports_of_any(m) if n == b or n.startswith(b + ".")]
            assert not bad, f"{m} imports {bad}"


def imports_of_any(module: str) -> set[str]:
    """Every module `module` names in an import (project or not), strings given to importlib included."""
    tree = source_of(module)
    out = set(string_imports(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


FRAMEWORKS = ("tensorflow", "torch", "tensorpack")


def test_no_neutral_module_imports_a_framework_even_inside_a_function():
    """The harness drives both trainers through their plugins (loaded by name), never by importing them."""
    bad = []
    for m in modules(NEUTRAL, halves=False):
        if m in FRAMEWORK_BENCHMARKS or m in FRAMEWORK_AWARE:
            continue
        for n in imports_of_any(m):
            if any(n == f or n.startswith(f + ".") for f in FRAMEWORKS) or is_half(n):
                bad.append(f"{m} imports {n}")
    assert not bad, "\n".join(bad)


def test_the_framework_halves_are_where_the_layout_says():
    """Each path's halves sit beside its declaration; the trainers are the harness's plugins, not top-level."""
    halves = [m for m in modules(PACKAGES) if is_half(m)]
    assert "consumers.zmq_consume.tf" in halves and "consumers.zmq_consume.torch" in halves
    assert "harness.tf.plugin" in halves and "harness.torch.plugin" in halves
    assert not [d.name for d in ROOT.iterdir() if d.is_dir() and d.name.endswith("_trainer")], "a top-level trainer"
    for trainer in ("harness/tf", "harness/torch"):
        assert not (ROOT / trainer / "inputs").exists(), f"an input path under {trainer}"
        assert not (ROOT / trainer / "models").exists(), f"a model under {trainer}"
    for f in (ROOT / "harness").rglob("*.py"):  # a path is a registered InputPath; a model is an nn.Module/ModelDesc
        text = f.read_text()
        assert "@register" not in text and "(nn.Module)" not in text and "(ModelDesc)" not in text, f


def test_the_stages_below_the_harness_never_import_it():
    """Paths, feeders and models serve the trainers; a half that reached up into its trainer would tie them."""
    bad = []
    for m in modules(("consumers", "feeders", "models", "frameworks")):
        bad += [f"{m} imports {n}" for n in imports_of_any(m) if n == "harness" or n.startswith("harness.")]
    assert not bad, "\n".join(bad)


def test_a_tensorflow_half_never_imports_torch_nor_a_pytorch_half_tensorflow():
    bad = []
    for m in modules(PACKAGES):
        other = ("torch",) if TF_HALF.match(m) else ("tensorflow", "tensorpack") if TORCH_HALF.match(m) else ()
        for n in imports_of_any(m):
            if any(n == f or n.startswith(f + ".") for f in other):
                bad.append(f"{m} imports {n}")
            if (TF_HALF.match(m) and TORCH_HALF.match(n)) or (TORCH_HALF.match(m) and TF_HALF.match(n)):
                bad.append(f"{m} imports {n}")
    assert not bad, "\n".join(bad)


MAX_FUNCTION_LINES = 60


def test_no_function_outside_tests_is_longer_than_sixty_lines():
    """A long function is split into named steps that say why; nested functions count with their parent."""
    long = []
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT)
        if rel.parts[0] == "tests" or any(p.startswith(".") or p in ("build", "__pycache__") for p in rel.parts):
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)
