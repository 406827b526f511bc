"""One config system for training: ``train-drafter`` and ``python -m dflash_trt.train`` take one set
of options generated from ``TrainSettings`` (help from the field descriptions, today's spellings),
plus a YAML ``--config`` and ``--set KEY=VALUE``; a flag on the command line wins."""

from __future__ import annotations

import typer.main
import yaml

from dflash_trt.cli import app, run
from dflash_trt.train import TrainSettings
from dflash_trt.train import launcher as train_launch


def _train_drafter():
    return next(c for c in typer.main.get_command(app).commands.values() if c.name == "train-drafter")


def test_both_commands_take_one_set_of_options_with_the_fields_help():
    cli = {p.name: p for p in _train_drafter().params}
    rank = {p.name: p for p in train_launch.command().params}
    assert set(cli) - set(rank) == {"nproc", "as_json"} and set(rank) <= set(cli)
    for name, field in TrainSettings.model_fields.items():
        assert cli[name].help == rank[name].help == field.description, name
        assert cli[name].opts == rank[name].opts
    spelled = {o for p in cli.values() for o in p.opts}
    assert {
        "-t",
        "-o",
        "-b",
        "--target-layer-ids",
        "--feature-shard-mb",
        "--regen-endpoint",
        "--config",
        "--set",
    } <= spelled
    assert "--no-thinking" in cli["thinking"].secondary_opts


def test_config_then_set_then_flags(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(
        yaml.safe_dump({"target": "T", "data": "D", "out": "O", "steps": 5, "lr": 1e-3, "target_layer_ids": "1,3"})
    )
    s = train_launch.settings_from_argv(
        ["--config", str(cfg), "--set", "steps=9", "--set", "anchors=4", "--lr", "0.002"]
    )
    assert (s.target, s.steps, s.anchors, s.lr, s.target_layer_ids) == ("T", 9, 4, 0.002, [1, 3])
    # a flag left at its default does not undo the file's value
    assert train_launch.settings_from_argv(["--config", str(cfg)]).steps == 5


def test_a_bad_config_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({"target": "T", "data": "D", "out": "O", "stpes": 5}))
    assert run(["train-drafter", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "stpes: unknown setting" in err
    assert run(["train-drafter", "--data", "D", "-o", str(tmp_path / "o")]) == 2
    assert "missing option --target" in capsys.readouterr().err
    assert run(["train-drafter", "--config", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml" in capsys.readouterr().err
