"""``hne-edge export`` / ``verify`` / ``inspect``: thin shells over :mod:`hne_edge.exporters`."""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

from ..bundle import ALL, BOTH, FIRST_HOSTS, MIXED, MIXED_PLANS, NODES, PLAN_GROUPS, PLAN_TABLE, PRECISIONS, WEIGHTS
from ..exporters.base import DEFAULT_OPSET, PLAN_CHOICES
from ..exporters.checkpoint import EXPORT_FORMATS
from ..exporters.onnx import DYNAMO_MIN_OPSET, EXPORTERS, exporter_opset  # torch-free at import, like .tensorrt
from ..exporters.tensorrt import HARDWARE_LEVELS
from ..progress import progress_for
from . import printable
from .options import BundlePath, FiniteRange, batch_sizes_option, flag_names, quiet_option, within_batch_range


# export's options that only a checkpoint export uses: refused with a bundle source ({parameter: flag})
_CHECKPOINT_ONLY = {"out_dir": "--out", "force": "--force", "no_verify": "--no-verify", "opset": "--opset",
                    "exporter": "--exporter", "no_torch_weights": "--no-torch-weights",
                    "no_first_leaf": "--no-first-leaf"}


@click.command("export")
@click.argument("source", type=click.Path(exists=True, path_type=Path), metavar="CHECKPOINT")
@click.option("--out", "out_dir", type=click.Path(), default=None,  # a str: an empty --out must not become "."
              help="Bundle directory to write (required for a checkpoint; refused if it exists without --force).")
@click.option("--format", "fmt", type=click.Choice(EXPORT_FORMATS), default="onnx", show_default=True,
              help="onnx: the portable bundle. tensorrt: ONNX plus engines built on this GPU.")
@click.option("--precision", "precision", multiple=True, metavar="|".join(PRECISIONS),
              help="Repeat or comma-separate for several (e.g. --precision fp32,fp16). Default fp32; from a bundle: "
                   "every precision it has ONNX for.")
@click.option("--batch-range", "batch", default="1:1:16", show_default=True, metavar="MIN:OPT:MAX",
              help="Batch sizes the bundle is built and verified for (engines: the optimization profile). From a "
                   "bundle: its own, the one range its manifest holds.")
@click.option("--batch", "batch_alias", default=None, hidden=True)  # deprecated spelling of --batch-range
@click.option("--opset", type=int, default=None,
              help=f"ONNX opset (default {DEFAULT_OPSET}, parsed by TensorRT 8.6+ and 10; {DYNAMO_MIN_OPSET} with "
                   f"--exporter dynamo, which writes no older one).")
@click.option("--plan", default=BOTH, show_default=True, metavar="|".join(PLAN_CHOICES),
              help="; ".join(f"{p}: {PLAN_TABLE[p].files}" for p in PLAN_GROUPS[ALL])
                   + f"; comma-separate several ({','.join(MIXED_PLANS)} for run --plan {MIXED}); "
                   + f"{BOTH}: {','.join(PLAN_GROUPS[BOTH])}; {ALL}: every plan.")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--no-verify", is_flag=True, help="Skip the comparison with PyTorch (not recommended).")
@click.option("--no-torch-weights", is_flag=True, help="Do not write torch/model.pt (PyTorch runtime backend).")
@click.option("--no-first-leaf", is_flag=True,
              help="Do not write the export-free first-leaf file (written beside a plan that runs leaf 0 first: "
                   f"{', '.join(FIRST_HOSTS)}; frames that stop after leaf 0 then run that plan's first steps).")
@click.option("--exporter", type=click.Choice(EXPORTERS), default="torchscript", show_default=True,
              help="torch.onnx exporter path (dynamo: fp32 only, opset 18 or later).")
@click.option("--workspace-mb", type=int, default=None, help="TensorRT builder workspace limit.")
@click.option("--hardware-compat", type=click.Choice(HARDWARE_LEVELS),
              default="none", show_default=True, help="TensorRT hardware compatibility level.")
@click.option("--version-compatible", is_flag=True, help="TensorRT VERSION_COMPATIBLE engines.")
@quiet_option
def export(source, out_dir, fmt, precision, batch, batch_alias, opset, plan, force, no_verify, no_torch_weights,
           no_first_leaf, exporter, workspace_mb, hardware_compat, version_compatible, quiet) -> None:  # fmt: skip
    """Export CHECKPOINT to a verified bundle at --out.

    With --format tensorrt, CHECKPOINT may also be an existing bundle
    directory: engines are then built from its ONNX files and added to it in
    place (the usual flow on a Jetson, which needs no PyTorch); --out,
    --force, --no-verify, --opset, --exporter and the --no-* options apply
    only to a checkpoint and are refused.
    """
    from ..bundle import read_manifest, variant_label
    from ..exporters.base import parse_batch, parse_plan, parse_precisions

    # each option checked before anything is read, its error naming the flag typed (the library's say "plan must be")
    with flag_names({"plan": "--plan", "precision": "--precision", "opset": "--opset",
                     "batch": "--batch" if batch_alias else "--batch-range"}):  # fmt: skip
        parse_plan(plan)
        precisions = parse_precisions(",".join(precision) or "fp32")
        batch_range = parse_batch(batch_alias or batch)
        opset = exporter_opset(exporter, opset, precisions)  # what the exporter cannot write
    trt_options = dict(workspace_mb=workspace_mb, hardware_compatibility=hardware_compat,
                       version_compatible=version_compatible)  # fmt: skip
    if source.is_dir():
        if fmt != "tensorrt":
            raise click.UsageError(f"{source} is a directory; export needs a checkpoint file (a bundle is only "
                                   "accepted with --format tensorrt, to add engines to it)")  # fmt: skip
        from ..exporters.tensorrt import build_engines, device_info, load_tensorrt

        ctx = click.get_current_context()
        typed = {p for p in ctx.params if ctx.get_parameter_source(p) is click.core.ParameterSource.COMMANDLINE}
        # engines are added to the bundle in place: these would not do what they say (--out NEW writes no NEW)
        ignored = [flag for p, flag in _CHECKPOINT_ONLY.items() if p in typed]
        if ignored:
            raise click.UsageError(f"{', '.join(ignored)} with a bundle {printable(source)}: engines are added to the "
                                   "bundle in place, and these apply only to a checkpoint export; expected none of "
                                   "them (copy the bundle first to add engines to a copy)")  # fmt: skip
        # the runtime accepts the batches the manifest names, so engines get its one batch range, no other
        bundle_batch = tuple(read_manifest(source, verify_files=False).input.batch)
        if typed & {"batch", "batch_alias"} and batch_range != bundle_batch:
            flag = "--batch" if batch_alias else "--batch-range"
            raise click.UsageError(f"{flag} {batch_alias or batch}: engines added to a bundle are built for its batch "
                                   f"range {':'.join(map(str, bundle_batch))} (its manifest holds one); expected that "
                                   f"or no {flag} (export the checkpoint again for another)")  # fmt: skip
        load_tensorrt(exporting=True)  # fail before any work: clear message + install hint, exit 2
        device_info()
        with progress_for(None, "tensorrt", "engine", quiet=quiet) as progress:  # None: all the bundle has
            entries = build_engines(source, precisions=precisions if precision else None,
                                    plans=None if plan in PLAN_GROUPS else parse_plan(plan),
                                    batch=bundle_batch, progress=progress, **trt_options)  # fmt: skip
        click.echo(f"built {len(entries)} TensorRT engine(s) into {printable(source)}")
        return
    if out_dir is None:
        raise click.UsageError("--out DIR is required when exporting a checkpoint")

    from ..exporters import export_checkpoint

    with progress_for(None, "export", "file", quiet=quiet) as progress:  # its first line once the checks passed
        path = export_checkpoint(
            source, out_dir, format=fmt, precisions=precisions, plan=plan, batch=batch_range, opset=opset, force=force,
            verify=not no_verify, torch_weights=not no_torch_weights, first_leaf=not no_first_leaf, exporter=exporter,
            tensorrt_options=trt_options, progress=progress,
        )
    manifest = read_manifest(path, verify_files=False)  # just written and verified: only the summary is read
    total = sum(f.bytes for f in manifest.files)
    click.echo(
        f"exported {len(manifest.files)} file(s), {total / 1e6:.2f} MB, "
        f"{', '.join(variant_label(*v) for v in manifest.variants())}"
        f"{'' if no_verify else ' (verified against PyTorch)'} -> {printable(path)}"
    )


@click.command("verify")
@click.argument("bundle", type=BundlePath(path_type=Path))
@click.option("--checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Compare every file and anytime prefix with this checkpoint's PyTorch model.")
@batch_sizes_option(None, "Batch sizes to run, within the bundle's batch range (default: its min and up to 4).")
@click.option("--frames", type=click.Path(exists=True, dir_okay=False), default=None, metavar="PATH.npz",
              help="Verify on these images (x: N,H,W,C uint8 or N,C,H,W float; one batch) instead of random ones.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the random images.")
@click.option("--atol", type=FiniteRange(min=0), default=None,
              help="Absolute bound. Given --atol or --rtol, every element must have |ONNX - reference| <= atol + "
                   "rtol * |reference| (numpy.allclose, Polygraphy); neither: max |ONNX - reference| <= atol + rtol * "
                   "max |reference| per output [default: 1e-4 for fp32, 2e-2 for fp16].")
@click.option("--rtol", type=FiniteRange(min=0), default=None,
              help="Relative bound, times each element's |reference| [default: 0 for fp32, 2e-2 for fp16].")
@quiet_option
def verify(bundle: Path, checkpoint: Path | None, batch_sizes: tuple[int, ...] | None, frames: str | None, seed: int,
           atol: float | None, rtol: float | None, quiet: bool) -> None:  # fmt: skip
    """Check BUNDLE: manifest, sha256, ONNX Runtime loads, plans agree (and vs PyTorch with --checkpoint)."""
    from ..bundle import read_manifest
    from ..exporters.verify import verify_bundle

    inputs = None
    if frames is not None:
        from ..runtime.bench import load_arrays
        from ..runtime.inputs import preprocess

        x, _ = load_arrays(frames)
        inputs = preprocess(x, read_manifest(bundle, verify_files=False).input) if x.dtype == np.uint8 else x

    if batch_sizes:
        within_batch_range(read_manifest(bundle, verify_files=False).input.batch, batch_sizes, "--batch-sizes")
    model = state = None
    if checkpoint is not None:
        from ..train.checkpoint import model_from_checkpoint

        model, state = model_from_checkpoint(checkpoint)
    with progress_for(None, "verify", "step", quiet=quiet) as progress:
        with flag_names({"atol": "--atol", "rtol": "--rtol"}):
            report = verify_bundle(bundle, model=model, batch_sizes=list(batch_sizes) if batch_sizes else None,
                                   progress=progress, inputs=inputs, seed=seed, atol=atol, rtol=rtol,
                                   checkpoint=state)  # fmt: skip
    click.echo(_printable_lines(report.format_table()))
    report.raise_for_failures()


@click.command("inspect")
@click.argument("bundle", type=BundlePath(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest JSON instead.")
@click.option("--no-verify-files", is_flag=True, help="Skip the sha256 check of every file (faster).")
def inspect(bundle: Path, as_json: bool, no_verify_files: bool) -> None:
    """Print BUNDLE's manifest as a readable tree, with file sizes and MACs."""
    from ..bundle import read_manifest

    manifest = read_manifest(bundle, verify_files=not no_verify_files)
    if as_json:
        click.echo(json.dumps(manifest.to_dict(), indent=2))
        return
    click.echo(_printable_lines(format_manifest(manifest, bundle)))


def _printable_lines(text: str) -> str:
    """Names in a manifest come from a file: escape control characters, keep the line breaks."""
    return "\n".join(printable(line) for line in text.splitlines())


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _macs(m: int) -> str:
    return f"{m / 1e6:,.2f}M MACs"


def format_manifest(manifest, bundle: Path) -> str:
    """Human-readable view of a manifest: header, provenance, then each variant as a tree or list."""
    from ..bundle import variant_label

    tree, inp = manifest.tree, manifest.input
    prov = manifest.provenance
    lines = [
        f"bundle {bundle}",
        f"  model {manifest.model_name}: {tree.num_leaves} leaves, branching {list(tree.branching)}, "
        f"{manifest.num_classes} classes",
        f"  input {inp.name} [{', '.join(map(str, inp.shape))}] {inp.dtype} {inp.layout}, "
        f"batch {':'.join(map(str, inp.batch))}, mean [{', '.join(f'{v:.4g}' for v in inp.mean)}] "
        f"std [{', '.join(f'{v:.4g}' for v in inp.std)}]",
        f"  MACs per sample: one leaf {_macs(manifest.prefix_macs()[0])}, all leaves {_macs(manifest.prefix_macs()[-1])}",
        "  provenance: " + ", ".join(f"{k} {v}" for k, v in prov.items()),
    ]
    for fmt, plan, precision in manifest.variants():
        files = manifest.files_for(plan, precision, fmt)
        total = sum(f.bytes for f in files)
        lines += ["", f"{variant_label(fmt, plan, precision)}: {len(files)} file(s), {_size(total)}"]
        if files[0].build:
            b = files[0].build
            lines.append(
                f"  built with TensorRT {b.get('tensorrt_version')} on {b.get('gpu')} (sm {b.get('compute_capability')}), "
                f"flags {b.get('flags')}, batch profile {b.get('batch_profile')}"
            )
        if plan == WEIGHTS:
            f = files[0]
            lines.append(f"  {f.path}  {_size(f.bytes)}  all {len(f.nodes)} nodes")
        elif plan == NODES:
            by_node = {f.nodes[0]: f for f in files}

            def label(node) -> str:
                f = by_node[node.id]
                return f"{f.path}  {_size(f.bytes)}  {_macs(f.macs)}  -> {f.outputs[0].name}"

            lines += ["  " + line for line in tree.describe(label).splitlines()]
        else:
            for f in files:
                outs = ", ".join(o.name for o in f.outputs)
                count = f.outputs[-1].shape[1] if len(f.outputs[-1].shape) == 3 else 1  # several leaves: (batch, n, C)
                leaves = f"leaf {f.leaf:>2}" if count == 1 else f"leaves {f.leaf}-{f.leaf + count - 1}"
                nodes = " > ".join(f.nodes) if len(f.nodes) <= 6 else f"{f.nodes[0]} and its subtree ({len(f.nodes)} nodes)"
                lines.append(f"  {leaves}  {f.path}  {_size(f.bytes)}  {_macs(f.macs)}  {f.inputs[0].name} -> {nodes} -> [{outs}]")
    return "\n".join(lines)

