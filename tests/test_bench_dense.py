"""``weightformer bench dense``: MAC counts against a hand count, the result document, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from weightformer.bench import dense
from weightformer.bench.subjects import get_subject
from weightformer.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_deit_trunk_macs_match_a_hand_count_with_attention():
    """DeiT-T at 64×96: 24 patches and a class token. Counted by hand: the patch embedding, then per block
    qkv, projection and MLP (12·D²·N) and the two attention matmuls (2·N²·D), which fused attention hides
    from torch's counter unless it is switched off."""
    d, n, patches = 192, 25, 24
    by_hand = patches * 16 * 16 * 3 * d + 12 * (12 * d * d * n + 2 * n * n * d)
    macs = dense.count_macs(get_subject("dense", "deit-t").build().eval(), 64, 96)
    assert macs["trunk_gmacs"] * 1e9 == pytest.approx(by_hand, rel=1e-9)
    assert macs["total_gmacs"] > macs["trunk_gmacs"]  # the pyramid adds its convolutions


def test_run_writes_rows_for_every_model_and_size(tmp_path: Path, capsys):
    config = dense.DenseBenchConfig(models=["wf-t", "deit-t-win"], sizes=[(64, 96)], modes=["infer"], repetitions=1,
                                    memory=False)
    result = dense.run(config, log=lambda message: None)
    rows = {row["model"]: row for row in result["rows"]}
    assert set(rows) == {"wf-t", "deit-t-win"} and all(r["padded"] == [64, 96] for r in rows.values())
    assert all(r["infer_img_per_s"] > 0 and r["trunk_params_m"] > 5 for r in rows.values())
    table = dense.markdown_table(result)
    assert "WeightFormer-T" in table and "DeiT-T (ViTDet windows)" in table and "### 64×96" in table


@pytest.mark.parametrize("args, message", [
    (["--sizes", "20"], "a size is S or HxW in pixels, at least 32"),
    (["--models", "resnet50"], "unknown model 'resnet50'"),
    (["--repetitions", "0"], "must be a number >= 1, got 0"),
    (["--models", ","], "no models given"),
    (["--sizes", ""], "no sizes given"),
    (["--device", "tpu"], "--device must be auto, cuda, cuda:N or cpu, got 'tpu'"),
])
def test_bad_settings_are_one_error_line(args, message, capsys):
    try:
        code = main(["bench", "dense", *args])
    except SystemExit as exit_:  # argparse's errors exit from the parser
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0]


def test_an_out_path_that_is_a_file_is_refused(tmp_path: Path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["bench", "dense", "--out", str(blocker / "sub")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
