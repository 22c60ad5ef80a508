"""The command line: verbs, JSON output, and usage errors instead of tracebacks."""

import json
import re
import subprocess
import sys

import pytest

from workbench.cli import main


def test_help_lists_the_verbs():
    out = subprocess.run([sys.executable, "-m", "workbench.cli", "--help"], capture_output=True, text=True, check=True)
    for verb in ("demo", "generate", "export", "presets"):
        assert verb in out.stdout


def test_generate_writes_json(tmp_path, capsys):
    out = tmp_path / "gen.json"
    main(["generate", "fbt:debug", "--prompt", "12+7=", "--prompt", "3*4=", "--regime", "standard,soft,fused",
          "--passes", "exact", "--max-new-tokens", "6", "--json", str(out)])
    result = json.loads(out.read_text())
    assert set(result["generations"]) == {"standard", "soft", "fused"}
    assert all(len(texts) == 2 for texts in result["generations"].values())
    assert "[soft] '12+7='" in capsys.readouterr().out


def test_export_from_a_saved_run(tmp_path):
    from workbench import build_model, save_model

    run = save_model(build_model("baseline", "debug"), tmp_path / "run")
    main(["export", str(run), str(tmp_path / "hf"), "--json", str(tmp_path / "export.json")])
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "export.json").read_text())["exact"] is True


@pytest.mark.parametrize(
    "argv,match",
    [
        (["generate", "gpt:debug", "--prompt", "x"], "unknown architecture 'gpt'"),
        (["generate", "fbt:huge", "--prompt", "x"], "unknown preset 'huge'"),
        (["generate", "nowhere", "--prompt", "x"], "neither a run directory nor ARCH:PRESET"),
        (["generate", "baseline:debug", "--prompt", "x", "--regime", "soft"], "needs a Full-Bandwidth model"),
        (["generate", "fbt:debug", "--prompt", "x", "--passes", "two"], "--passes: expected a positive integer or 'exact', got 'two'"),
        (["generate", "fbt:debug", "--prompt", "x", "--max-new-tokens", "500"], "n_ctx=128"),
    ],
)
def test_bad_arguments_are_usage_errors(argv, match, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.search(match, err), err
