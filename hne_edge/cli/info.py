"""``hne-edge info MODEL``: the tree, per-node costs and the anytime cost curve."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from ..tree import TREE_PRESETS
from .options import flag_names, force_option


@click.command("info")
@click.argument("model_name", metavar="MODEL")
@click.option("--num-classes", type=int, default=None, help="Classifier outputs (default: the model's).")
@click.option(
    "--tree",
    "tree",
    default="hne",
    show_default=True,
    help=f"{' | '.join(TREE_PRESETS)} | comma-separated branching factors (e.g. 1,2,2,2,2).",
)
@click.option("--input-size", type=int, default=None, help="Square input side (default: the model's).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Also draw the tree to this PNG, in an existing folder; a file there is replaced only if hne-edge "
                   "drew it.")  # fmt: skip
@force_option("a --plot FILE")
def info(
    model_name: str, num_classes: int | None, tree: str, input_size: int | None, as_json: bool, plot_path: str | None,
    force: bool,
) -> None:
    """Print MODEL's tree, per-node MACs/params and the anytime cost curve."""
    from ..errors import InputError
    from ..fileio import refuse_foreign, sealed_png
    from ..models import create_model, tree_cost
    from ..models.cost import format_cost
    from ..tree import parse_tree

    def check_plot(path: str) -> None:  # before any work, and again just before the figure is written
        refuse_foreign(path, sealed_png, force=force, flag="--plot FILE")

    if plot_path is not None and not plot_path.strip():  # Path("") is the current directory
        raise InputError("--plot: received an empty path; expected the path of a PNG file to draw")
    if plot_path:  # before any work: a folder is not made, nor a file of the user's replaced
        # "out/" names a folder (Path drops the slash: its parent would be the current folder)
        folder = Path(plot_path) if plot_path.endswith(("/", os.sep)) else Path(plot_path).parent
        if not folder.is_dir():
            raise InputError(f"--plot {plot_path}: {folder} {'is not a folder' if folder.exists() else 'does not exist'};"
                             " expected a PNG path in an existing folder (create the folder first)")  # fmt: skip
        check_plot(plot_path)
    overrides = {"tree": parse_tree(tree, "--tree")}
    if input_size is not None:
        overrides["input_size"] = input_size
    with flag_names({"num_classes": "--num-classes", "input_size": "--input-size", "TreeSpec.branching": "--tree"}):
        model = create_model(model_name, num_classes=num_classes, **overrides).eval()
    cost = tree_cost(model)
    if plot_path:
        from ..plots import plot_tree

        macs = {k: v.macs for k, v in cost.nodes.items()}
        plot_tree(model.tree, plot_path, macs, title=f"{model_name}: {model.tree.branching}", check=check_plot)
    if as_json:
        data = cost.to_dict()
        data["tree"] = {
            "branching": list(model.tree.branching),
            "leaf_order": list(model.tree.leaf_order),
            "nodes": [
                {"id": n.id, "parent": n.parent, "children": list(n.children), "depth": n.depth}
                for n in model.tree.nodes
            ],
        }
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(model.tree.describe())
    click.echo()
    click.echo(format_cost(cost, model.tree))
