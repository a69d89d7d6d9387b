"""``captionrl`` command line: a thin layer over configs, training and evaluation.

Each subcommand lives in the module that does the work, which exposes ``CONFIG`` (its config dataclass)
and ``run_command(cfg) -> int``; the parser is generated from ``CONFIG`` (``captionrl.config.
add_config_arguments``: ``--config FILE.yaml``, ``key=value`` words, a ``--flag`` per top-level field,
``--help`` listing every field with its default). This file only maps command names to modules,
imported lazily so that ``captionrl --help`` is instant and a missing optional dependency only breaks its
own command.

Library modules report progress through ``logging`` (``logging.getLogger(__name__)``, under the
``captionrl`` logger) and stay silent unless their caller wants the messages; the command line wants
them, so ``main`` shows the ``captionrl`` logger's INFO messages on stderr as plain lines. A command's
product (its table, its JSON summary) is printed to stdout by its ``run_command``, so that
``captionrl ... --json | jq`` reads only the product.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from captionrl.config import add_config_arguments, check_output_paths, config_from_args, path_in_the_way
from captionrl.errors import CaptionRLError

# (command words) -> (module, one-line help)
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("models",): ("captionrl.commands.models", "list backends and check that the embedded model loads"),
    ("caption",): ("captionrl.commands.caption", "caption series (or images) with a captioner backend"),
    ("preflight",): ("captionrl.commands.preflight", "a LineupRL config's reward on the honest reference, the hacking probes and a captioner's own captions, before training; which term each probe needs"),
    ("plan",): ("captionrl.commands.plan", "GPU memory plan of a preset: weights, optimizer, activations, vLLM share and KV cache per GPU"),
    ("candidates",): ("captionrl.domains.candidates", "mine distractor candidate sets for a corpus"),
    ("data", "prepare"): ("captionrl.domains.prepare", "a benchmark's local copy -> a prepared dataset folder (splits, lineups, manifest)"),
    ("eval", "identify"): ("captionrl.eval.identification", "caption->series and series->caption identification"),
    ("eval", "bottleneck"): ("captionrl.eval.bottleneck", "caption-only forecasting and reconstruction"),
    ("eval", "entail"): ("captionrl.eval.entailment", "fraction of reference captions a caption entails"),
    ("eval", "spans"): ("captionrl.eval.spans", "span audit: green/blue/red/gray claims of captions"),
    ("eval", "pairwise"): ("captionrl.eval.pairwise", "pairwise win rate, both orders"),
    ("eval", "rank"): ("captionrl.eval.ranking", "blind ranking of five captions"),
    ("eval", "qa"): ("captionrl.eval.qa", "caption-based QA (multiple choice and open-ended)"),
    ("eval", "agreement"): ("captionrl.eval.agreement", "judge-human agreement (accuracy, Cohen's kappa)"),
    ("eval", "paper"): ("captionrl.eval.paper", "the paper's evaluation of caption files: identification, entailment, Table 3, bottleneck + p-values"),
    ("eval", "sweep"): ("captionrl.train.sweep", "alias of 'train sweep', kept for existing scripts"),
    ("eval", "hacking"): ("captionrl.eval.hacking", "reward-hacking probes for every reward"),
    ("eval", "recheck"): ("captionrl.eval.recheck", "finished LineupRL runs' held-out captions judged again by today's final checks, with a mean and 95% interval over runs"),
    ("train", "lineup"): ("captionrl.train.lineup", "LineupRL: RLOO/GRPO with the identification reward"),
    ("train", "rubicap"): ("captionrl.train.rubicap", "RubiCap: GRPO with rubric rewards"),
    ("train", "moco"): ("captionrl.train.moco", "MoCo Rubric: GRPO with a momentum Generator-Judge"),
    ("moco", "records"): ("captionrl.train.moco_records", "teachers + rubric writer + judge -> caption/rubric/judgment records for train moco-sft"),
    ("train", "moco-sft"): ("captionrl.train.moco_sft", "shared multi-role SFT (Policy, Generator, Judge)"),
    ("train", "sft"): ("captionrl.train.sft", "SFT distillation from a teacher's captions"),
    ("train", "sweep"): ("captionrl.train.sweep", "reward-knob sweep (verifier, K, distractor rule): train + evaluate each setting, Tables 10-15, Figure 3"),
    ("rubrics", "build"): ("captionrl.judges.rubric_build", "teacher committee captions + rubric writer -> rubric store"),
    ("report",): ("captionrl.eval.report", "gather results of several runs into the paper's tables"),
    ("serve", "reward"): ("captionrl.serve.reward", "serve a reward over HTTP (OpenRLHF remote reward contract, verl client)"),
}


class _StderrNow(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a message is emitted, not the one it was made with, so
    that a caller (or pytest's ``capsys``) that swaps ``sys.stderr`` after the first command still gets
    the messages of the next one."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> object:  # type: ignore[override]
        return sys.stderr


def configure_logging(level: int = logging.INFO) -> None:
    """Show the library's messages as plain lines on stderr; idempotent, so ``main`` may run many times
    in one process (tests) without printing each line twice. Other libraries' loggers are left as they
    are (the root logger's level is not touched), and records still propagate to the root logger for a
    host application's (or pytest's ``caplog``) handlers."""
    log = logging.getLogger("captionrl")
    if not any(isinstance(h, _StderrNow) for h in log.handlers):
        handler = _StderrNow()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(level)


def build_parser() -> tuple[argparse.ArgumentParser, dict[tuple[str, ...], argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="captionrl",
        description="Train captioners with RL from verifiable rewards (LineupRL, RubiCap, MoCo Rubric), and measure them.",
    )
    from captionrl import __version__

    parser.add_argument("--version", action="version", version=f"captionrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    leaves: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for words, (_module, text) in COMMANDS.items():
        help_text = text.replace("%", "%%")  # argparse %-formats help strings ("95% interval" would crash --help)
        if len(words) == 1:
            leaves[words] = sub.add_parser(words[0], help=help_text, description=text)
            continue
        if words[0] not in groups:
            grp = sub.add_parser(words[0], help=f"{words[0]} subcommands")
            groups[words[0]] = grp.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
        leaves[words] = groups[words[0]].add_parser(words[1], help=help_text, description=text)
    return parser, leaves


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    configure_logging()
    parser, leaves = build_parser()
    words = tuple(a for a in argv[:2] if not a.startswith("-"))
    key = words[:2] if words[:2] in COMMANDS else words[:1]
    if key not in COMMANDS:
        parser.parse_args(argv)  # prints help or the "invalid choice" error
        parser.print_help()
        return 2
    module_name = COMMANDS[key][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("captionrl"):
            print(f"captionrl {' '.join(key)}: not available in this version ({exc.name} missing)", file=sys.stderr)
            return 2
        raise
    config_cls = module.CONFIG
    add_config_arguments(leaves[key], config_cls)
    args = parser.parse_args(argv)
    cfg = None
    try:
        cfg = config_from_args(config_cls, args)
        check_output_paths(cfg)  # an output folder that names a file fails here, not after a model loaded
        code = int(module.run_command(cfg) or 0)
        close_process_group()
        return code
    except CaptionRLError as exc:  # input (files, configs, servers): one line, no traceback; bugs keep theirs
        print(f"error: {type(exc).__name__}: {' '.join(str(exc).splitlines())}", file=sys.stderr)
        return 2
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:  # a setting's path met later on
        named = path_in_the_way(exc, cfg)
        if named is None:
            raise
        print(f"error: ConfigError: {named}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: rerun the same command to resume", file=sys.stderr)
        return 130


def close_process_group() -> None:
    """End a distributed command cleanly: each rank tears its own process group down before exiting.

    Left to the interpreter's exit, the group is destroyed by static destructors while a communication
    thread may still be joinable, and a rank that finished its work can abort ("terminate called without
    an active exception") and fail the whole launch; accelerate's ``end_training`` does the same for its
    own scripts. No barrier: the other ranks return while rank 0 runs the final checks alone, which may
    outlast a collective's timeout. Only a command that imported torch can hold a group, so other commands
    never load it; a failed command skips this and leaves its exit to the launcher."""
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    raise SystemExit(main())
