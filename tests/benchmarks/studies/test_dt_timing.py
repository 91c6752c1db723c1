"""The DT throughput table's machine record: the load at the start and the end of a measurement
(benchmarks/studies/meta.py), shown by dt_timing's page."""

from __future__ import annotations


def test_machine_record_spans_the_measurement_and_the_tables_show_both_loads(monkeypatch) -> None:
    from benchmarks.studies import dt_timing, meta
    from rl_transformers.runs import provenance

    loads = iter([(0.5, 0.4, 0.3), (2.5, 1.0, 0.5)])
    monkeypatch.setattr(provenance.os, "getloadavg", lambda: next(loads))
    start = provenance.machine_info("cpu", 1)
    done = provenance.finish_machine_info(start)
    assert done["loadavg_start"] == [0.5, 0.4, 0.3] and done["loadavg_end"] == [2.5, 1.0, 0.5]
    assert done["timestamp"] == start["timestamp"] <= done["finished"]
    assert meta.load_text(done).startswith("load at start 0.5, at end 2.5 (")
    assert meta.load_text(start) == "load at start 0.5"  # older records without an end load still render
    report = {"reference": "ours", "table": {}, "machine": done, "setup": {"threads": 1}}
    assert "load at start 0.5, at end 2.5" in dt_timing.render_markdown(report)
