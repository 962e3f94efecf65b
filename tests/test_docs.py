"""Every code block of README.md, CONTRIBUTING.md and docs/*.md runs as written.

- ```python blocks: the blocks of one file run in order in one namespace (like a notebook), in a
  temporary working directory of their own; the files share one fresh process, each from a clean
  Keras session (those in OWN_PROCESS get a process each).
- ```bash / ```sh blocks: each `keras-vit ...` command runs as the console script runs it, in
  order, in one temporary working directory per file (other shell lines, such as `make` or
  `pip install`, are not run); the commands of one file share one process.
- A block preceded by `<!-- needs: REASON -->` is skipped for that reason; when the comment
  holds a code block of its own, that stand-in runs instead (the same steps, offline and small).

Both kinds run once, in the JAX pass (marker backend_independent): what a block shows is the
documentation's claim (names, arguments, outputs); how each API behaves on each backend is the
claim of its own test module, which every pass runs (constructors, presets, training, features,
quantization, bfloat16 inference, exports). The one block that uses a backend's own engine
(docs/TPU.md: tf.distribute on logical CPU devices) does not use Keras' backend at all.

New files under docs/ are picked up automatically.
"""

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from conftest import INDEPENDENT_BACKEND

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON_LANGUAGES = {"python", "py", "python3"}
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}

_FENCE = re.compile(r"^ {0,3}(`{3,})\s*([\w+-]*)")
_MARKER = "<!-- needs:"


@dataclasses.dataclass
class Block:
    path: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    needs: str = None  # the marker's reason
    stand_in: "Block" = None


def doc_files():
    files = ["README.md", "CONTRIBUTING.md"]
    docs = os.path.join(ROOT, "docs")
    if os.path.isdir(docs):
        files += [f"docs/{name}" for name in sorted(os.listdir(docs)) if name.endswith(".md")]
    return [f for f in files if os.path.isfile(os.path.join(ROOT, f))]


def _read_fence(lines, start, path):
    """(Block, index after the closing fence) for the fence opening at lines[start]."""
    match = _FENCE.match(lines[start])
    ticks, language = match.group(1), match.group(2).lower()
    end = start + 1
    while end < len(lines) and not re.match(rf"^ {{0,3}}{ticks}`*\s*$", lines[end]):
        end += 1
    if end == len(lines):
        raise AssertionError(f"{path}:{start + 1}: code block never closed")
    return Block(path, start + 1, language, "\n".join(lines[start + 1 : end]) + "\n"), end + 1


def parse_blocks(path):
    """The fenced code blocks of one Markdown file, with their `needs:` markers."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().splitlines()
    blocks, marker, i = [], None, 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(_MARKER):
            text = line.strip()[len(_MARKER):]
            stand_in, i = None, i + 1
            if not text.endswith("-->"):  # a multi-line comment, maybe holding the stand-in
                while i < len(lines) and lines[i].strip() != "-->":
                    if _FENCE.match(lines[i]):
                        stand_in, i = _read_fence(lines, i, path)
                        continue
                    i += 1
                if i == len(lines):
                    raise AssertionError(f"{path}: a '{_MARKER}' comment is never closed")
                i += 1
            reason = text.removesuffix("-->").strip().rstrip(":;").strip()
            marker = (reason, stand_in)
            assert reason, f"{path}:{i}: a '{_MARKER}' marker must say what the block needs"
            continue
        if _FENCE.match(line):
            block, i = _read_fence(lines, i, path)
            if marker is not None:
                block.needs, block.stand_in = marker
                marker = None
            blocks.append(block)
            continue
        if line.strip() and marker is not None:
            raise AssertionError(f"{path}:{i + 1}: a '{_MARKER}' marker must come right before its code block")
        i += 1
    assert marker is None, f"{path}: a '{_MARKER}' marker at the end of the file has no code block"
    return blocks


def runnable(blocks, languages):
    """(blocks to run: each block or its stand-in, [(block, reason) skipped])."""
    run, skipped = [], []
    for block in blocks:
        if block.language not in languages:
            continue
        if block.needs is None:
            run.append(block)
        elif block.stand_in is not None:
            assert block.stand_in.language in languages, (
                f"{block.path}:{block.line}: the stand-in of a {block.language} block is {block.stand_in.language}"
            )
            run.append(block.stand_in)
        else:
            skipped.append((block, block.needs))
    return run, skipped


def shell_commands(block):
    """The `keras-vit` commands of a shell block (continuation lines joined)."""
    commands, current = [], ""
    for line in block.code.splitlines():
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        text = current.strip().removeprefix("$ ")
        if text.startswith("keras-vit ") or text == "keras-vit":
            commands.append(text)
        current = ""
    return commands


def _environment():
    env = dict(os.environ, KERAS_BACKEND=INDEPENDENT_BACKEND, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    env["PATH"] = os.pathsep.join((os.path.dirname(sys.executable), env.get("PATH", "")))
    env["HF_HUB_OFFLINE"] = "1"  # a block that downloads must be marked
    env["MPLBACKEND"] = "Agg"
    return env


FILES = doc_files()


def test_the_docs_have_code_blocks():
    blocks = {path: parse_blocks(path) for path in FILES}
    assert "README.md" in blocks
    python, _ = runnable(blocks["README.md"], PYTHON_LANGUAGES)
    shell, _ = runnable(blocks["README.md"], SHELL_LANGUAGES)
    assert len(python) >= 3 and sum(len(shell_commands(b)) for b in shell) >= 3


_SESSION = r"""
import json, os, sys, traceback
# {path: [{"where", "code"}]}: each file's blocks in order, in its own namespace and working folder.
files, results = json.loads(sys.stdin.read()), {}
for number, (path, blocks) in enumerate(files.items()):
    if "keras" in sys.modules:  # the later files of a shared process start from a clean Keras session
        import keras
        keras.config.set_dtype_policy("float32")
        keras.utils.clear_session()
    os.chdir(os.path.join(sys.argv[1], str(number)))
    namespace, results[path] = {"__name__": "__main__"}, None
    for block in blocks:
        print(f"--- {block['where']}", flush=True)
        print(f"--- {block['where']}", file=sys.stderr, flush=True)
        try:
            exec(compile(block["code"], block["where"], "exec"), namespace)
        except BaseException:
            results[path] = f"{block['where']}:\n{traceback.format_exc()}"
            print(f"FAILED: {block['where']}", file=sys.stderr, flush=True)
            break
print("RESULTS " + json.dumps(results), flush=True)
"""


#: Files whose blocks set up the process itself (TensorFlow's logical devices before TensorFlow
#: initialises): they run in a process of their own.
OWN_PROCESS = {"docs/TPU.md"}


def _python_blocks(path):
    """(the blocks to run as _SESSION takes them, or None with the reason to skip)."""
    blocks, skipped = runnable(parse_blocks(path), PYTHON_LANGUAGES)
    if not blocks:
        return None, (f"{path}: no python block to run ({len(skipped)} marked as needing: "
                      f"{'; '.join(reason for _, reason in skipped)})")
    return [{"where": f"{b.path}:{b.line}", "code": b.code} for b in blocks], None


def _run_sessions(files, folder):
    """Run the python blocks of `files` ({path: blocks}) in one fresh process, each file in
    folder/<number>: ({path: None, or what failed}, the process's output)."""
    for number in range(len(files)):
        os.makedirs(os.path.join(folder, str(number)), exist_ok=True)
    out = subprocess.run([sys.executable, "-c", _SESSION, str(folder)], input=json.dumps(files), capture_output=True,
                         text=True, cwd=folder, env=_environment(), timeout=900)
    reported = [line for line in out.stdout.splitlines() if line.startswith("RESULTS ")]
    results = json.loads(reported[-1][len("RESULTS "):]) if reported else {}
    output = f"{out.stdout[-3000:]}\n{out.stderr[-6000:]}"
    if out.returncode:  # a crash: the files it did not report failed with it
        results = {path: results.get(path) or f"the process ended with {out.returncode}" for path in files}
    return results, output


@pytest.fixture(scope="module")
def shared_sessions(tmp_path_factory):
    """The python blocks of every file not in OWN_PROCESS, each file in its own namespace and
    working folder, in one process (one start-up of the backend instead of one per file)."""
    files = {}
    for path in FILES:
        blocks, _ = _python_blocks(path)
        if blocks and path not in OWN_PROCESS:
            files[path] = blocks
    return _run_sessions(files, tmp_path_factory.mktemp("docs"))


@pytest.mark.backend_independent
@pytest.mark.parametrize("path", FILES)
def test_python_blocks_run(path, tmp_path, request):
    blocks, reason = _python_blocks(path)
    if blocks is None:
        pytest.skip(reason)
    if path in OWN_PROCESS:
        results, output = _run_sessions({path: blocks}, tmp_path)
    else:
        results, output = request.getfixturevalue("shared_sessions")
    assert path in results, f"{path} did not run:\n{output}"
    assert results[path] is None, f"{results[path][-6000:]}\n{output}"


# The `keras-vit` commands of one file, in order, in one process: each is what the console
# script runs (the entry point its metadata names, with the command's arguments), from a clean
# Keras session, and reports its exit status.
_COMMANDS = r"""
import json, shlex, sys, traceback
from importlib.metadata import entry_points
(script,) = entry_points(group="console_scripts", name="keras-vit")
entry = script.load()
for where, command in json.loads(sys.stdin.read()):
    print(f"--- {where}: {command}", flush=True)
    print(f"--- {where}: {command}", file=sys.stderr, flush=True)
    if "keras" in sys.modules:  # after the first command (which starts as the console script does)
        import keras
        keras.config.set_dtype_policy("float32")
        keras.utils.clear_session()
    try:
        status = entry(shlex.split(command, comments=True)[1:])
    except SystemExit as stop:
        status = stop.code
    except BaseException:
        traceback.print_exc()
        status = "an exception"
    if status:
        print(f"FAILED ({status}): {where}: {command}", file=sys.stderr)
        sys.exit(1)
"""


@pytest.mark.backend_independent
@pytest.mark.skipif(shutil.which("keras-vit", path=os.path.dirname(sys.executable)) is None,
                    reason="the keras-vit console script is not installed")
@pytest.mark.parametrize("path", FILES)
def test_shell_commands_run(path, tmp_path):
    """A file with several plain commands runs them in one process (_COMMANDS: the console
    script's entry point, one clean session per command); otherwise each runs through bash and
    the console script."""
    blocks, skipped = runnable(parse_blocks(path), SHELL_LANGUAGES)
    commands = [(f"{b.path}:{b.line}", c) for b in blocks for c in shell_commands(b)]
    if not commands:
        pytest.skip(f"{path}: no keras-vit command to run")
    env = _environment()
    if len(commands) > 1 and all(_is_plain(command) for _, command in commands):
        out = subprocess.run([sys.executable, "-c", _COMMANDS], input=json.dumps(commands), capture_output=True,
                             text=True, cwd=tmp_path, env=env, timeout=900)
        assert out.returncode == 0, f"{commands}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        assert "Traceback" not in out.stderr, out.stderr[-3000:]
        return
    for where, command in commands:
        out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=tmp_path, env=env,
                             timeout=900)
        assert out.returncode == 0, f"{where}: {command}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        assert "Traceback" not in out.stderr


def _is_plain(command):
    """True for a command that is only words (no pipe, redirection, list or expansion): its
    arguments are what shlex reads."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    return "$" not in command.split("#", 1)[0] and not any(set(token) <= set("();<>|&") for token in lexer)


def _readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def _layout_sections():
    """README's Layout block as {entry: its text}: an entry ("cli.py", "models/") starts a line
    indented by six spaces; the deeper-indented lines under it continue its description."""
    lines = _readme().split("## Layout", 1)[1].splitlines()
    sections, current = {}, None
    for line in lines[1:]:
        if line.strip() and not line.startswith("    "):
            break  # the end of the indented block
        entry = re.match(r"^ {6}(\S+)", line)
        if entry:
            current = entry.group(1)
            sections[current] = line
        elif current is not None and line.startswith("        "):
            sections[current] += " " + line.strip()
    return sections


def test_the_readme_layout_names_every_module():
    """Every module and folder of the package is named in README's Layout, each module of a
    sub-package in its folder's entry."""
    sections = _layout_sections()
    package = os.path.join(ROOT, "keras_vit")
    missing = []
    for folder, dirs, files in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        relative = os.path.relpath(folder, package)
        if relative == ".":
            missing += [f for f in files if f.endswith(".py") and f not in sections]
            missing += [f"{d}/" for d in dirs if f"{d}/" not in sections]
            continue
        top = relative.split(os.sep)[0] + "/"
        text = sections.get(top, "")
        missing += [f"{relative}/{f}" for f in files
                    if f.endswith(".py") and f != "__init__.py" and not re.search(rf"\b{re.escape(f)}\b", text)]
    assert not missing, f"README.md's Layout does not name: {', '.join(sorted(missing))}"


def test_the_readme_says_which_commands_take_the_model_arguments():
    """README's sentence on the model arguments holds for every command."""
    from keras_vit import cli

    text = " ".join(_readme().split())
    match = re.search(r"((?:`\w+`, )*`\w+` and `\w+`) take the same model arguments \(`--arch`, `--weights`, "
                      r"`--preset`, `--image-size`\)", text)
    assert match, "README.md no longer says which commands take the model arguments"
    named = set(re.findall(r"`(\w+)`", match.group(1)))
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    assert named <= set(commands)
    for name, command in commands.items():
        options = {o for action in command._actions for o in action.option_strings}
        has_all = {"--arch", "--weights", "--preset", "--image-size"} <= options
        assert has_all == (name in named), name


def _unbound_names(code, where):
    """The global names a block reads but neither imports nor assigns (nor are builtins)."""
    import builtins
    import symtable

    top = symtable.symtable(code, where, "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    read, tables = set(), [top]
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        read |= {s.get_name() for s in table.get_symbols()
                 if s.is_referenced() and (table is top or s.is_global()) and not (table is not top and s.is_assigned())}
    return sorted(read - bound - set(dir(builtins)))


@pytest.mark.backend_independent
def test_every_python_block_runs_alone():
    """A reader copies one block: it imports or defines every name it uses."""
    missing = []
    for path in FILES:
        for block in runnable(parse_blocks(path), PYTHON_LANGUAGES)[0]:
            names = _unbound_names(block.code, f"{block.path}:{block.line}")
            if names:
                missing.append(f"{block.path}:{block.line}: {', '.join(names)}")
    assert not missing, "blocks that use names they do not import or define:\n" + "\n".join(missing)
