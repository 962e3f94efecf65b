"""The package's layers (DESIGN.md), read from the source with `ast`: every `import` of a
keras_vit module, at the top of a file or inside a function, is an edge. The graph has no circle,
and no module imports one of a higher layer except the one edge named in UPWARD."""

import ast
import pathlib

import pytest

pytestmark = pytest.mark.backend_independent

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "keras_vit"

#: The layers, bottom up; a module belongs to the first prefix it starts with (a prefix is a
#: module or a package with everything in it).
LAYERS = (
    # the floor: files, names, shapes, the Hub, backend edges
    ("keras_vit.errors", "keras_vit.version", "keras_vit.names", "keras_vit.geometry", "keras_vit.choices",
     "keras_vit.storage", "keras_vit.hub", "keras_vit.backend_workarounds", "keras_vit.huge_pages", "keras_vit.performance",
     "keras_vit.compilation", "keras_vit.imagenet"),
    ("keras_vit.layers", "keras_vit.quantization"),
    ("keras_vit.models",),
    ("keras_vit.checkpoints", "keras_vit.presets"),
    ("keras_vit.loading",),
    ("keras_vit.applications", "keras_vit.flops", "keras_vit.distribution", "keras_vit.export", "keras_vit.training",
     "keras_vit.evaluation", "keras_vit.analysis", "keras_vit.data", "keras_vit.runs"),
    ("keras_vit",),  # the package's public face (keras_vit/__init__.py)
    ("keras_vit.commands", "keras_vit.cli", "keras_vit.demo"),
)

#: Imports from a lower layer up to a higher one, each with its reason.
UPWARD = {
    # Keras spells deployment `model.export(...)`: the model classes' method hands the call to the
    # exporter (imported when called), which itself only reads the family record below it.
    ("keras_vit.models.export_method", "keras_vit.export"),
}


def _modules():
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _graph():
    """{module: set of the keras_vit modules it imports}."""
    modules = _modules()

    def known(name):
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported |= {known(a.name) for a in node.names if a.name.split(".")[0] == "keras_vit"}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([node.module] if node.module else []))
                if base.split(".")[0] != "keras_vit":
                    continue
                # `from keras_vit.models import family` imports the module; `import x` of a name, its module.
                imported |= {known(f"{base}.{a.name}") if f"{base}.{a.name}" in modules else known(base)
                             for a in node.names}
        graph[name] = imported - {name}
    return graph


def layer_of(module):
    """The rank in LAYERS of `module` (the face, "keras_vit", is its own prefix only)."""
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or (p != "keras_vit" and module.startswith(p + ".")) for p in prefixes):
            return rank
    return None


def circles(graph):
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph():
    return _graph()


def test_the_graph_is_read(graph):
    # The reading itself: known edges of each kind (top-level, inside a function, `from package import module`).
    assert "keras_vit.storage.files" in graph["keras_vit.storage.safetensors"]
    assert "keras_vit.export" in graph["keras_vit.models.export_method"]  # imported inside `export`
    assert "keras_vit.layers" in graph["keras_vit"]  # `from keras_vit import layers`
    assert len(graph) > 100


def test_every_module_has_a_layer(graph):
    assert [m for m in sorted(graph) if layer_of(m) is None] == [], "add each new module's prefix to LAYERS"


def test_no_import_circles(graph):
    assert circles(graph) == []


def test_no_upward_imports_but_the_named_ones(graph):
    ranks = {m: layer_of(m) for m in graph}
    upward = {(a, b) for a, targets in graph.items() for b in targets
              if None not in (ranks[a], ranks[b]) and ranks[b] > ranks[a]}
    assert upward == UPWARD


def test_circles_are_found():
    # The detector itself, on a made-up graph: a -> b -> c -> a is one circle, d stands alone.
    made_up = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert circles(made_up) == [["a", "b", "c"]]
