"""The `attnbench` verbs, one module each (as git's builtin/ and lm-eval's commands are laid out).

Each verb's module has `NAME`, `add_parser(subparsers)`, which adds its arguments to the `attnbench` parser,
and `main(args) -> int`, which answers and gives the exit status; harness/cli.py parses, runs the checks all
verbs share and calls the verb's `main`. Building the parser imports every verb's module, so a module's
top level imports only argparse and arguments.py; torch, Lightning and the registries load inside `main`.

    arguments.py       argument groups and checks several verbs share (--plugin/--data-root/--runs-dir,
                       --precision, --logger, data parallel, launcher; --set and --seeds parsing; counts)
    from_catalogue.py  `list`, `describe` and mistyped names answered from the cached catalogue, without torch
    run_and_tune.py    planning, --set wording and DDP start-up that `run` and `tune` share
    list.py describe.py check.py run.py bench.py tune.py perf.py scaling.py probe.py leaderboard.py
    claims.py results.py: the verbs (results.py also dispatches its own sub-verbs)"""
