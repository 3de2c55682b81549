"""The benchmarks' shared output helpers (no Ray, no environments): flat JSON, PNG, table, rates."""
import json
import math

import pytest

from benchmarks import common


def _args(tmp_path, *extra):
    return common.parser("doc", "quick").parse_args(["--out", str(tmp_path / "r.json"), *extra])


def test_report_writes_flat_json_and_png_next_to_it(tmp_path, capsys):
    figures = {"async_speedup": 1.5, "mode": "x", "skipped": None, "quick": True}

    def plot(path):
        plt = common.pyplot()
        fig, ax = plt.subplots()
        ax.plot([0, 1], [0, 1])
        common.save(fig, path, "t")

    common.report(figures, _args(tmp_path), plot, headline=("async_speedup",))
    assert json.loads((tmp_path / "r.json").read_text()) == figures
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "async_speedup  1.5" in capsys.readouterr().out


def test_report_plot_flag_overrides_the_default_png(tmp_path):
    args = _args(tmp_path, "--plot", str(tmp_path / "sub" / "p.png"))
    assert common.plot_path(args) == tmp_path / "sub" / "p.png"
    assert common.plot_path(common.parser("d", "q").parse_args([])) is None


def test_report_refuses_nested_figures_and_writes_nothing(tmp_path):
    with pytest.raises(TypeError, match="flat"):
        common.report({"a": {"b": 1}}, _args(tmp_path))
    assert not (tmp_path / "r.json").exists()


def test_rate_of_a_running_total():
    assert common.rate([(10.0, 100.0), (12.0, 150.0), (20.0, 600.0)]) == pytest.approx(50.0)
    assert math.isnan(common.rate([(1.0, 5.0)]))  # one point has no rate


def test_ratio_is_nan_when_nothing_was_measured():
    assert common.ratio(3.0, 2.0) == 1.5
    assert math.isnan(common.ratio(3.0, 0.0)) and math.isnan(common.ratio(3.0, float("nan")))


def test_print_table_aligns_columns(capsys):
    common.print_table([{"mode": "async", "steps": 1234.5678}, {"mode": "sync", "steps": 12.0}])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["mode", "steps"]
    assert len({len(line) for line in lines}) == 1
    assert "1235" in lines[2]


def test_libero_part_skips_with_a_reason_when_absent(tmp_path):
    reason = common.libero_unavailable(tmp_path / "missing.yaml")
    importable = not any(common.optional_import(m) for m in common.LIBERO_MODULES)
    expected = "missing.yaml not found" if importable else "not importable"
    assert reason and expected in reason, reason
