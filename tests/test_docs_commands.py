"""Every command the README and docs/ show is checked, every relative link resolves, and the Hugging Face guide's
examples run, so that a page cannot promise an option, a variant, a suite or a file that is not there.

- Each `attnbench ...` and `make ...` line of a shell block (and each inline `attnbench ...` / `make ...` span) is
  parsed by the `attnbench` argument parser itself, in this process; its subcommand, options, choices, tasks,
  variants, suites and files must exist. A line with placeholders (`TASK`, `<variant>`, `[--prune]`, `...`) is
  checked for what it names concretely: its subcommand, its options and the names that are not placeholders.
- A concrete `run`, `tune` or `bench` line then runs as a dry run (`--dry-run`: plans, resolves every --set value,
  checks the data, writes nothing), except where its answer depends on this machine (DDP device counts, a
  PostgreSQL server, more workers than cores).
- `make` lines: the target and variables exist in the Makefile (and SUITE=, TASK=, VARIANT= name real ones), and
  `make -n` accepts the line.
- The checker fails on a planted unknown option, unknown variant and broken link (tested below)."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").rglob("*.md"))
PAGES = [README, *DOCS]
STUDY_PAGES = sorted((REPO / "leaderboards" / "studies").rglob("*.md"))
"""Study pages: their links are checked too (their commands are the studies' own, run by their authors)."""

EXAMPLE_FILES = {"my_variant.py", "my-suite.yaml", "slurm-tiny.yaml", "mine.jsonl", "ddp.sbatch", "tune.sbatch"}
"""Files the pages tell the reader to write (the plugin and the suite are the pages' own examples, written out below
for the dry runs; slurm-tiny.yaml is tests/slurm's suite)."""

PLACEHOLDER = re.compile(r"[<>\[\]|{}…]|\.\.\.|^[A-Z][A-Z0-9_]*(\.[a-z]+)?$|=[A-Z][A-Z_]*$|^[A-Z]+(=|\.\.\.)")
"""TASK, VARIANT, N, FILE.py, OUT.jsonl, KEY=VALUE, <variant>, [--prune], SOURCE..., {md,csv}."""

MACHINE_DEPENDENT = ("--strategy", "--storage", "--launcher", "--devices")
"""Options whose dry run answers for this machine (its GPUs, a database server, sbatch), not for the page."""


@dataclass(frozen=True)
class Shown:
    page: Path
    line: int
    text: str
    inline: bool


def shown_commands(text: str, page: Path) -> list[Shown]:
    """Every `attnbench ...` / `make ...` a page shows: lines of its shell blocks (```bash, ```sh, ``` and indented
    4-space code) and inline code spans."""
    found: list[Shown] = []
    fence = None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else (stripped[3:].strip() or "plain")
            continue
        if fence is not None:
            if fence in ("bash", "sh", "shell", "plain"):
                command = _command_of(stripped)
                if command:
                    found.append(Shown(page, number, command, False))
            continue
        if line.startswith("    ") and not line.lstrip().startswith("-"):
            command = _command_of(stripped)
            if command:
                found.append(Shown(page, number, command, False))
                continue
        for span in re.findall(r"`([^`]+)`", line):
            command = _command_of(span.strip())
            if command:
                found.append(Shown(page, number, command, True))
    return found


def _command_of(line: str) -> str | None:
    line = line.removeprefix("$ ")
    line = re.sub(r"^\.venv/bin/", "", line)
    if re.match(r"(attnbench|make)( |$)", line):
        return line
    return None


def _words(command: str) -> list[str]:
    return shlex.split(command, comments=True)


def _is_placeholder(word: str) -> bool:
    return bool(PLACEHOLDER.search(word))


# ---- attnbench lines ---------------------------------------------------------------------------------------------

@dataclass
class Names:
    tasks: set
    variants: set
    suites: set


@pytest.fixture(scope="module", autouse=True)
def own_cache(tmp_path_factory):
    """A cache of this module's own: the guide's plugin is registered in this process, and the catalogue and plan
    snapshots that the dry runs write would otherwise list `tempered` to every later command sharing the cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNBENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def names(example_files) -> Names:
    from modules.attention import list_attentions
    from modules.registry import load_plugin_file
    from modules.tasks import list_tasks

    from harness.plan.suite import list_suites

    from modules.attention import ATTENTIONS

    load_plugin_file(example_files["my_variant.py"])  # the guide's plugin registers `tempered`
    yield Names(set(list_tasks()), set(list_attentions()), set(list_suites()))
    ATTENTIONS.unregister("tempered")  # later tests see the built-ins only


@pytest.fixture(scope="module")
def example_files(tmp_path_factory) -> dict[str, Path]:
    """The pages' own example files, written out: the plugin of the adding-a-variant guide and the README's suite."""
    folder = tmp_path_factory.mktemp("examples")
    guide = (REPO / "docs" / "guides" / "adding-a-variant.md").read_text()
    plugin = folder / "my_variant.py"
    plugin.write_text(re.search(r"```python\n# my_variant.py\n(.*?)```", guide, re.S).group(1))
    suite = folder / "my-suite.yaml"
    suite.write_text(re.search(r"```yaml\n(name: my-suite\n.*?)```", README.read_text(), re.S).group(1))
    return {"my_variant.py": plugin, "my-suite.yaml": suite}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    from harness.commands.reference import subcommand_parsers

    return subcommand_parsers(parser)


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings}


def command_problems(words: list[str], names: Names, template: bool) -> list[str]:
    """What is wrong with `attnbench WORDS...` (words after `attnbench`): [] when it parses and everything it
    names exists. `template`: the words may hold placeholders; only what is concrete is checked."""
    from harness.cli import build_parser
    from harness.plan.suite import SuiteError, suite_path

    parser = build_parser()
    if words and _is_placeholder(words[0]):
        return []  # `attnbench ...`: the command named, not a line
    if not words or words[0].startswith("-"):
        return [] if all(w in ("--version", "--help", "-h") for w in words) else [f"no subcommand in {words}"]
    subs = _subparsers(parser)
    verb = words[0] if words[0] in subs else None
    rest = words[1:]
    if verb and rest and f"{verb} {rest[0]}" in subs:
        verb, rest = f"{verb} {rest[0]}", rest[1:]
    if verb is None:
        return [f"unknown subcommand {words[0]!r} (known: {', '.join(s for s in subs if ' ' not in s)})"]
    if verb == "results" and not rest:
        return []  # `attnbench results` named as a verb
    sub = subs[verb]
    options = _options(sub)
    problems = []
    positionals, i = [], 0
    while i < len(rest):
        word = rest[i]
        if word.startswith("-") and not _is_placeholder(word.split("=")[0]):
            flag, _, inline_value = word.partition("=")
            action = options.get(flag)
            if action is None:
                problems.append(f"`attnbench {verb}` has no option {flag}")
                i += 1
                continue
            takes = action.nargs != 0
            value = inline_value or (rest[i + 1] if takes and not inline_value and i + 1 < len(rest) else None)
            if takes and value is not None and not _is_placeholder(value):
                if action.choices and value not in action.choices:
                    problems.append(f"{flag} {value!r}: not one of {list(action.choices)}")
                if flag == "--suite":
                    for one in value.split():
                        if Path(one).name in EXAMPLE_FILES:
                            continue
                        try:
                            suite_path(one)
                        except SuiteError as exc:
                            problems.append(str(exc))
                if flag == "--plugin" and Path(value).name not in EXAMPLE_FILES and not (REPO / value).is_file():
                    problems.append(f"--plugin {value}: no such file")
            i += 2 if takes and not inline_value else 1
            continue
        positionals.append(word)
        i += 1
    concrete = [p for p in positionals if not _is_placeholder(p)]
    if verb in ("run", "tune") and len(positionals) >= 2:
        task, variant = positionals[:2]
        if not _is_placeholder(task) and task not in names.tasks:
            problems.append(f"unknown task {task!r}")
        if not _is_placeholder(variant) and variant not in names.variants:
            problems.append(f"unknown variant {variant!r}")
    if verb == "describe" and concrete and concrete[0] not in names.tasks | names.variants:
        problems.append(f"unknown task or variant {concrete[0]!r}")
    if verb == "check" and concrete and Path(concrete[0]).name not in EXAMPLE_FILES and not (REPO / concrete[0]).is_file():
        problems.append(f"check {concrete[0]}: no such file")
    if verb == "probe" and concrete and concrete[0] not in (sub._actions[-1].choices or concrete[:1]):
        problems.append(f"unknown probe {concrete[0]!r}")
    if not template and not problems:
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                parser.parse_args(words)
        except SystemExit as exc:
            if exc.code:
                problems.append(f"does not parse: {stderr.getvalue().strip().splitlines()[-1]}")
    return problems


def dry_run_problem(words: list[str], example_files: dict[str, Path], tmp_path: Path) -> str | None:
    """Run a concrete `run`/`tune`/`bench` line as a dry run in this process; its problem, or None."""
    from harness.cli import run_command

    argv = [str(example_files.get(w, w)) for w in words]
    argv = [a for a in argv if a != "--promote" and a != "--no-wait"]
    argv += ["--dry-run", "--runs-dir", str(tmp_path / "runs")]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_command(argv)
    return None if code == 0 else f"dry run exited {code}: {err.getvalue().strip()[-400:]}"


def _dry_runnable(words: list[str]) -> bool:
    if words[0] not in ("run", "tune", "bench") or any(w.split("=")[0] in MACHINE_DEPENDENT for w in words):
        return False
    if any(Path(w).name in EXAMPLE_FILES - {"my_variant.py", "my-suite.yaml"} for w in words):
        return False
    if "--workers" in words[:-1] and words[words.index("--workers") + 1].isdigit():
        return int(words[words.index("--workers") + 1]) <= 2  # more than this 2-core machine gives is refused here
    return True


# ---- make lines --------------------------------------------------------------------------------------------------

def makefile_names() -> tuple[set, set]:
    text = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-zA-Z][a-zA-Z_-]*):", text, re.M))
    variables = set(re.findall(r"^([A-Z][A-Z_]*)\s*[?:]?=", text, re.M))
    return targets, variables


def make_problems(words: list[str], names: Names) -> list[str]:
    targets, variables = makefile_names()
    problems = []
    for word in words:
        if "=" in word:
            key, value = word.split("=", 1)
            if key not in variables:
                problems.append(f"the Makefile has no variable {key}")
            elif not _is_placeholder(value):
                known = {"SUITE": names.suites, "TASK": names.tasks, "VARIANT": names.variants}.get(key)
                if known is not None and value not in known:
                    problems.append(f"{key}={value}: no such {key.lower()}")
        elif not word.startswith("-") and not _is_placeholder(word) and word not in targets:
            problems.append(f"the Makefile has no target {word!r}")
    return problems


# ---- links -------------------------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r" ", "-", re.sub(r"[^\w\- ]", "", text))


def link_problems(text: str, page: Path) -> list[str]:
    problems = []
    in_code = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z]+:", target) or target.startswith("#") and not target[1:]:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                problems.append(f"{page.relative_to(REPO) if page.is_relative_to(REPO) else page.name}:{number}: "
                                f"link {target} does not resolve")
            elif anchor and resolved.suffix == ".md":
                anchors = {slug(h) for h in re.findall(r"^#+ (.*)$", resolved.read_text(), re.M)}
                if anchor not in anchors:
                    problems.append(f"{page.name}:{number}: link {target}: no heading #{anchor} in {resolved.name}")
    return problems


# ---- the checker over a page -------------------------------------------------------------------------------------

def page_problems(text: str, page: Path, names: Names, example_files, tmp_path, dry_run: bool = True) -> list[str]:
    problems = list(link_problems(text, page))
    seen = set()
    for shown in shown_commands(text, page):
        where = f"{page.name}:{shown.line}: `{shown.text}`"
        try:
            words = _words(shown.text)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        template = shown.inline or any(_is_placeholder(w) for w in words)
        if words[0] == "make":
            found = make_problems(words[1:], names)
            if not found and not template and tuple(words) not in seen:
                done = subprocess.run(["make", "-n", "-C", str(REPO), *words[1:]], capture_output=True, text=True, timeout=60)
                if done.returncode:
                    found.append(f"make -n failed: {done.stderr.strip()[-300:]}")
        else:
            found = command_problems(words[1:], names, template)
            if not found and not template and dry_run and _dry_runnable(words[1:]) and tuple(words) not in seen:
                problem = dry_run_problem(words[1:], example_files, tmp_path)
                if problem:
                    found.append(problem)
        seen.add(tuple(words))
        problems += [f"{where}: {p}" for p in found]
    return problems


def _has_data() -> bool:
    """The dry runs plan against the data (as `bench` does); without a data root here only they are skipped."""
    from datamodules.paths import default_data_root

    root = default_data_root()
    return root is not None and (Path(root) / "planetoid").is_dir()


@pytest.fixture(scope="module")
def checked(names, example_files, tmp_path_factory):
    return lambda text, page, dry_run=True: page_problems(text, page, names, example_files,
                                                          tmp_path_factory.mktemp("dry"), dry_run and _has_data())


def test_every_command_and_link_of_the_readme_and_docs(checked):
    problems = [p for page in PAGES for p in checked(page.read_text(), page)]
    assert not problems, "\n".join(problems)


def test_every_link_of_the_study_pages_resolves():
    problems = [p for page in STUDY_PAGES for p in link_problems(page.read_text(), page)]
    assert not problems, "\n".join(problems)


def test_the_pages_show_commands_at_all():
    """The extraction finds the README's daily loop (so an empty extraction cannot pass the test above)."""
    shown = [s.text for s in shown_commands(README.read_text(), README)]
    for expected in ("make bench", "make test", "attnbench run cora softmax --seed 0", "attnbench bench --suite quick --dry-run",
                     "make leaderboard", "attnbench check my_variant.py"):
        assert any(s.startswith(expected) for s in shown), expected
    assert sum(len(shown_commands(p.read_text(), p)) for p in PAGES) > 60


def python_module_problems(text: str, page: Path) -> list[str]:
    """Every `python -m MODULE` a page names (the studies, the generators, the test tools) is a module here."""
    import importlib.util

    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        for module in re.findall(r"python3? -m ([A-Za-z_][\w.]*)", line):
            if module.split(".")[0] in ("harness", "modules", "datamodules", "tests") and importlib.util.find_spec(module) is None:
                problems.append(f"{page.name}:{number}: python -m {module}: no such module")
    return problems


def test_every_python_module_the_pages_run_exists():
    problems = [p for page in [*PAGES, *STUDY_PAGES] for p in python_module_problems(page.read_text(), page)]
    assert not problems, "\n".join(problems)
    assert python_module_problems("`python -m harness.studies.no_such_study`", REPO / "docs" / "planted.md")  # planted


# ---- plants: the checker must catch each -------------------------------------------------------------------------

@pytest.mark.parametrize("planted, words", [
    ("```bash\n.venv/bin/attnbench bench --suite quick --no-such-option 3\n```", "has no option --no-such-option"),
    ("```bash\n.venv/bin/attnbench run cora no-such-variant --seed 0\n```", "unknown variant 'no-such-variant'"),
    ("Run `attnbench run cora sofmax` once.", "unknown variant 'sofmax'"),
    ("```bash\nattnbench bench --suite no-such-suite\n```", "unknown suite 'no-such-suite'"),
    ("```bash\nattnbench run cora softmax --precision 64\n```", "not one of"),
    ("See [the guide](guides/no-such-page.md).", "does not resolve"),
    ("See [running](guides/running.md#no-such-heading).", "no heading #no-such-heading"),
    ("```bash\nmake bench SUITE=no-such-suite\n```", "SUITE=no-such-suite: no such suite"),
    ("```bash\nmake no-such-target\n```", "no target 'no-such-target'"),
    ("```bash\nattnbench run cora softmax --set attention.alpha=2\n```", "dry run exited 2"),
])
def test_the_checker_catches_a_planted_mistake(checked, planted, words):
    if words.startswith("dry run") and not _has_data():
        pytest.skip("no local data: the dry runs are off")
    problems = checked(planted, REPO / "docs" / "planted.md")
    assert any(words in p for p in problems), problems


def test_the_checker_passes_the_same_lines_without_the_plant(checked):
    clean = ("```bash\n.venv/bin/attnbench bench --suite quick --workers 2\nattnbench run cora softmax --seed 0\n"
             "make bench SUITE=quick\n```\nSee [running](guides/running.md#commands) and `attnbench describe TASK`.")
    assert checked(clean, REPO / "docs" / "planted.md", False) == []


# ---- the Hugging Face guide's examples run -----------------------------------------------------------------------

def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


@pytest.mark.parametrize("page", [REPO / "docs" / "guides" / "hugging-face.md", README], ids=lambda p: p.name)
def test_the_hugging_face_examples_run(page, tmp_path, monkeypatch):
    blocks = python_blocks(page.read_text())
    if page == README:
        blocks = [b for b in blocks if "modules.hf" in b]
    assert blocks
    monkeypatch.chdir(tmp_path)  # the Trainer example writes its output folder here
    for block in blocks:
        exec(compile(block, f"{page.name} example", "exec"), {"__name__": "docs_example"})  # noqa: S102 - the docs' own code


# ---- generated pages ---------------------------------------------------------------------------------------------

def test_the_generated_reference_pages_and_changelog_match_their_generator():
    """docs/reference/commands.md (the parser), variants.md (describe) and docs/CHANGELOG.md (the source-versions
    table with each bump's reason) equal what `python -m harness.commands.reference` writes."""
    from harness.commands import reference

    stale = reference.stale_pages()
    assert not stale, f"{[str(p.relative_to(REPO)) for p in stale]} are stale: run python -m harness.commands.reference"


def test_the_changelog_refuses_a_bump_without_a_reason(tmp_path, monkeypatch):
    import json

    from harness.commands import reference

    table = json.loads(reference.SOURCE_VERSIONS.read_text()) + [{"variant": "softmax", "version": "2", "source": "0" * 12}]
    fake = tmp_path / "source_versions.json"
    fake.write_text(json.dumps(table))
    monkeypatch.setattr(reference, "SOURCE_VERSIONS", fake)
    with pytest.raises(ValueError, match="no reason for softmax 2"):
        reference.changelog_page()


def test_the_command_reference_lists_every_option_of_every_verb():
    from harness.cli import build_parser

    page = (REPO / "docs" / "reference" / "commands.md").read_text()
    for name, sub in _subparsers(build_parser()).items():
        assert f"## attnbench {name}\n" in page
        for option in _options(sub):
            if sub._option_string_actions[option].help != argparse.SUPPRESS:
                assert option in page, f"attnbench {name} {option}"
