"""The Python pipeline example (examples/python/pipeline.py) runs, writes each release, and run again against its
durable ledger returns the same numbers and spends nothing."""

import importlib.util
import json

from conftest import CONFIG, ROOT

import dpfusion


def load_example():
    spec = importlib.util.spec_from_file_location("pipeline", ROOT / "examples" / "python" / "pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pipeline_example_writes_releases_and_a_rerun_spends_nothing(tmp_path):
    config = tmp_path / "pipeline.toml"
    text = CONFIG.read_text().replace("../examples", str(ROOT / "examples"))
    config.write_text(text + f'\n[ledger]\npath = "{tmp_path / "ledger.sqlite"}"\nbudget = "pipeline"\n')
    pipeline = load_example()
    queries = pipeline.default_queries()
    assert len(queries) == 8
    first = pipeline.main([str(config), str(tmp_path / "one")])
    assert first, "the demo queries have answered statements"
    spent = dpfusion.Session(str(config)).budget()["rho_spent"]
    assert spent > 0
    second = pipeline.main([str(config), str(tmp_path / "two")])
    assert [p.name for p in second] == [p.name for p in first]
    assert dpfusion.Session(str(config)).budget()["rho_spent"] == spent, "a re-run spends nothing"
    for a, b in zip(first, second):
        one, two = (json.loads(p.with_suffix(".json").read_text()) for p in (a, b))
        assert one["rows"] == two["rows"], "the same noisy numbers, no new draw"
        assert one["charge"]["id"] == two["charge"]["id"]
        assert a.with_suffix(".parquet").exists()


def test_split_statements_splits_as_the_command_does():
    parts = dpfusion.split_statements("SELECT 1; -- a; comment\nSELECT ';' ;")
    assert len(parts) == 2 and parts[0].strip() == "SELECT 1" and "';'" in parts[1], parts
