"""The `bbox` command line: one subcommand per pipeline stage, plus `run`, `sweep`, `merge`, `findings`, `eval`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

from bbox_sae import __version__
from bbox_sae.errors import BBoxError, printable
from bbox_sae.stages import BY_NAME, FEATURES, STAGE_NAMES, STAGES
from bbox_sae.variants import BASELINES


class _Parser(argparse.ArgumentParser):
    """Usage mistakes end in the tool's one error line, `bbox: error: ...`, like every other failure,
    after the usage of the (sub)command that was mistyped."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        command = self.prog.removeprefix("bbox").strip()
        self.exit(2, printable(f"bbox: error: {command + ': ' if command else ''}{message} (see `{self.prog} --help`)") + "\n")


def _global(p: argparse.ArgumentParser, top: bool) -> None:
    """Options that mean the same for every command, accepted before or after the subcommand. On a
    subcommand they default to unset, so that `bbox -v train` is not undone by the subcommand's default."""
    unset = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument("-v", "--verbose", action="store_true", help="log what each step does (INFO)", **unset)


CONFIG_HELP = "YAML config (see configs/); relative paths in it resolve against the working directory"
SWEEP_CONFIG_HELP = (
    "sweep file: `base: CONFIG`, the `sae.*` values to sweep (lists are the axes) and optionally `features: true` "
    "(configs/sweep-dict-size.yaml); or a config whose list-valued sae.* fields are the axes"
)


SET_HELP = "override a config field; the value is YAML (sae.k=32, models.0.window=1024 for the first model, 'compare=[[a, b]]'); repeatable"


def _common(p: argparse.ArgumentParser, config_help: str = CONFIG_HELP, config_required: bool = False) -> None:
    _global(p, top=False)
    if config_required:
        p.add_argument("--config", "-c", required=True, help=config_help)
    else:
        p.add_argument("--config", "-c", default=None, help=config_help + "; default: the config.yaml of --output-dir, a run made before")
    p.add_argument("--output-dir", "-o", default=None, help="overrides the config's output_dir")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)


def _stage_choices(what: str) -> str:
    """Help naming every stage, in the order `bbox run` runs them."""
    return f"{what}: " + ", ".join(STAGE_NAMES) + " (in the order `bbox run` runs them)"


EVAL_HELP = (
    "planted: plant known differences into a copy of model A's scores and measure which the pipeline "
    "recovers, with the null pair (no difference) for its false discoveries; "
    "ablation: on a finished run, the same extraction without the performance columns (w=0), "
    "from an untrained SAE and from k-means; "
    "coherence: on a finished run, how nameable its kept latents and findings are (rule F1, label scores)"
)
BASELINE_HELP = "extract from a baseline instead of the trained SAE: random (an untrained SAE of the same width) or kmeans (k-means clusters of the matrix)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bbox", description=__doc__)
    _global(parser, top=True)
    parser.add_argument("--version", action="version", version=f"bbox-sae {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    for stage in STAGES:
        p = sub.add_parser(stage.name, help=stage.help)
        _common(p)
        for option in stage.options:
            p.add_argument(option.flag, dest=option.dest, default=None, help=option.help, **option.argparse)
        if stage is FEATURES:
            # Not an option of the stage: a baseline is a run of its own (variants.run_baseline).
            p.add_argument("--baseline", choices=BASELINES, default=None, help=BASELINE_HELP)

    p = sub.add_parser("merge", help="check that all scoring (or embedding) shards are complete and intact")
    _common(p)
    p.add_argument(
        "--stage",
        action="append",
        choices=[s.name for s in STAGES if s.sharded],
        default=None,
        help="the sharded stage to check: score (the models' log-probs) or embed (the context embeddings); repeatable; default score",
    )

    p = sub.add_parser("sweep", help="train one SAE per combination of a sweep file's sae.* values on a run's current build")
    _common(p, SWEEP_CONFIG_HELP, config_required=True)
    p.add_argument("--features", action="store_true", help="also run the features stage on each SAE (the sweep file's `features: true`)")
    p.add_argument("--wandb-sweep-yaml", default=None, help="also write an equivalent W&B sweep YAML here")

    p = sub.add_parser("run", help="every stage in order, skipping those already up to date")
    _common(p)
    p.add_argument(
        "--force", action="append", default=[], choices=STAGE_NAMES, metavar="STAGE", help=_stage_choices("redo this stage and those after it (repeatable)")
    )
    p.add_argument("--until", default=None, choices=STAGE_NAMES, metavar="STAGE", help=_stage_choices("stop after this stage"))

    p = sub.add_parser("findings", help="print a finished run's findings: statement, winner, held-out Δlog p with its 95%% CI, n, who proposed it")
    _global(p, top=False)
    p.add_argument("run_dir", help="the run's output dir (runs/demo)")
    p.add_argument("--json", action="store_true", help="one JSON object per finding instead of the table")

    p = sub.add_parser("eval", help="evidence: planted-difference recovery and the null pair, ablations, coherence of a run")
    p.add_argument("what", choices=["planted", "ablation", "coherence"], help=EVAL_HELP)
    _common(p)
    planted = p.add_argument_group("eval planted only")
    planted.add_argument(
        "--rules",
        default=None,
        help="YAML file of planted rules (default: the config's planted_rules, else the Shakespeare rules shipped with bbox, as in configs/planted-rules-shakespeare.yaml)",
    )
    planted.add_argument("--null-seeds", type=int, default=3, help="null-pair runs (seeds 0..N-1); 0 skips them")
    planted.add_argument("--ablations", action="store_true", help="also the w=0, untrained-SAE and k-means variants")
    return parser


def config_path(args) -> str:
    """--config, else the config.yaml a run saved in --output-dir: `bbox report -o runs/demo`."""
    if args.config is not None:
        return args.config
    if args.output_dir is None:
        raise BBoxError(f"{args.command}: give --config CONFIG, or --output-dir of a run made before (it holds its config.yaml)")
    from bbox_sae.layout import RunLayout

    saved = RunLayout(Path(args.output_dir)).config
    if not saved.is_file():
        raise BBoxError(f"{saved}: no config.yaml here, so this is not a run made before; give --config CONFIG")
    return str(saved)


def _load(args):
    from bbox_sae.config import check_saved_config, load_config
    from bbox_sae.feasibility import check_memory

    cfg = load_config(config_path(args), args.overrides, args.output_dir)
    # Before any command takes the lock or writes: every command saves its config there.
    check_saved_config(cfg)
    check_memory(cfg, trains=args.command in ("run", "train", "eval"), extracts=args.command in ("run", "features", "eval"))
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    return cfg


def _print(result) -> None:
    if result is not None:
        print(json.dumps(result, indent=2, default=str))


def dispatch(args) -> int:
    from bbox_sae.config import ensure_output_dir, save_resolved

    cmd = args.command
    if cmd == "findings":
        from bbox_sae.pipeline import print_findings

        print_findings(Path(args.run_dir), as_json=args.json)
        return 0
    if cmd == "sweep":
        from bbox_sae.sweep import run_sweep

        run_sweep(args.config, args.overrides, args.output_dir, wandb_sweep_yaml=args.wandb_sweep_yaml, features=args.features)
        return 0
    cfg = _load(args)
    if cmd == "run":
        from bbox_sae.pipeline import run_all

        run_all(cfg, force=args.force, until=args.until)  # saves the config once it holds the lock
        return 0
    from bbox_sae.manifest import Manifest

    if cmd in STAGE_NAMES and (BY_NAME[cmd].sharded or getattr(args, "shard", None)):
        # Shard workers (`--shard i/n`, a Slurm array) share one output dir, so they take no lock.
        manifest = Manifest.read(cfg.out)
        _refuse_early(cmd, cfg, args, manifest)
        save_resolved(cfg)
        return _single_command(cmd, cfg, args, manifest)
    from bbox_sae.bookkeeping import run_lock

    if cmd == "eval" and args.what == "planted":
        from bbox_sae.evaluation.planting import load_rules, planted_rules_path

        load_rules(planted_rules_path(cfg, args.rules))  # a bad rules file is refused before the output dir is made
    with run_lock(ensure_output_dir(cfg)):
        # Only now, holding the lock: a command refused by it must leave the directory as it was.
        # `eval planted` saves its own config (model B read from its planted file) once it has
        # checked that the output dir is not a run of the user's own.
        manifest = Manifest.read(cfg.out)
        _refuse_early(cmd, cfg, args, manifest)
        if not (cmd == "eval" and args.what == "planted"):
            save_resolved(cfg)
        return _single_command(cmd, cfg, args, manifest)


def _refuse_early(cmd: str, cfg, args, manifest) -> None:
    """What a command would refuse for, checked before it writes anything, its config included: a
    refused `bbox embed --shard 5/2` had withdrawn the embed record, a refused `bbox report` had
    rewritten config.yaml, `bbox eval ablation` on tables another config made had rewritten
    ablation-w0/ and baselines/ first, and `bbox eval coherence` reported on them as this config's."""
    from bbox_sae.bookkeeping import require_current_inputs
    from bbox_sae.corpus.documents import parse_shard

    if getattr(args, "shard", None) is not None:
        parse_shard(args.shard)
    for name in getattr(args, "models", None) or []:
        cfg.model(name)
    if cmd in STAGE_NAMES and not BY_NAME[cmd].runs_first:  # `bbox score` ingests first
        require_current_inputs(BY_NAME[cmd], cfg, manifest)
    if cmd == "eval" and args.what in ("ablation", "coherence"):
        # Both read the run's features and labels as this config's.
        require_current_inputs(BY_NAME["report"], cfg, manifest, reader=f"eval {args.what}")


def _single_command(cmd: str, cfg, args, manifest) -> int:
    if cmd == "features" and args.baseline:
        from bbox_sae.variants import run_baseline

        _print(run_baseline(cfg, args.baseline))
    elif cmd in STAGE_NAMES:
        from bbox_sae.stages import run_command

        stage = BY_NAME[cmd]
        _print(run_command(stage, cfg, manifest, **{o.dest: getattr(args, o.dest) for o in stage.options}))
    elif cmd == "merge":
        from bbox_sae.bookkeeping import record_finished

        for name in args.stage or ["score"]:
            stage = BY_NAME[name]
            stage.check_shards(cfg)
            record_finished(stage, cfg, manifest, {"merged": True})
            print(f"{name}: all shards complete and intact")
    elif cmd == "eval" and args.what == "planted":
        from bbox_sae.evaluation import run_planted

        run_planted(cfg, rules_path=args.rules, null_seeds=tuple(range(args.null_seeds)), ablations=args.ablations)
    elif cmd == "eval" and args.what == "coherence":
        from bbox_sae.evaluation import run_coherence

        run_coherence(cfg)
    elif cmd == "eval":
        from bbox_sae.evaluation import run_ablation

        run_ablation(cfg)
    return 0


def _os_error_line(err: OSError) -> str:
    """One line naming the path: what a user needs to fix a permission, a full disk or a read-only mount."""
    where = err.filename if err.filename is not None else "?"
    if err.filename2 is not None:
        where = f"{where} -> {err.filename2}"
    return f"{where}: {err.strerror or err}"


class _PrintableFormatter(logging.Formatter):
    """Log lines quote labels, corpus words and a server's replies: no terminal escapes get through."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), keep="\n")


class Terminated(BaseException):
    """SIGTERM, what Slurm, `docker stop` and systemd send at a time limit, raised where the
    process is: it unwinds as Ctrl-C does (the run lock released, temp files removed), where the
    signal's default action ends the process without a word."""


def _terminate(signum, frame) -> None:
    # Once: the cleanup this starts is not cut short by a second SIGTERM, which then kills as usual.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(_PrintableFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return dispatch(args)
    except BBoxError as err:
        print(f"bbox: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"bbox: error: {BBoxError(_os_error_line(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bbox: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130
    except Terminated:
        print("bbox: terminated (SIGTERM); re-run the same command to resume", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
