"""Run keys: every field that determines a result is in the content hash, nothing else is.

Two specs that differ in a result-determining field must never share a record (one would be skipped as
"already finished"); two that differ only in how they are named must share it (or a relabelled suite would
re-run everything)."""

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from harness.plan import PRECISIONS
from harness.plan.spec import RECORD_SCHEMA, RunSpec, make_spec
from modules.attention import attention_entry, list_attentions, resolve_config
from modules.tasks import get_task

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted((REPO / "leaderboards" / "records").glob("*.json"))


def other_value(value):
    """A different value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "-other"
    if value is None:
        return 0.5
    if isinstance(value, (list, tuple)):
        return [*value, 1]
    raise AssertionError(f"no other value for {value!r}")


BASE = make_spec("cora", "gmm", 0)


def test_the_key_is_the_documented_hash_of_the_identity_fields():
    spec = make_spec("cora", {"name": "gmm", "beta": 0.5}, 3, {"lr": 0.01}, label="gmm-tuned", extra={"suite": "s"})
    identity = {"schema": RECORD_SCHEMA, "task": "cora", "task_version": spec.task_version, "variant": "gmm",
                "variant_version": spec.variant_version, "attention": dict(spec.attention), "params": dict(spec.params), "seed": 3}
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    assert spec.key == hashlib.sha256(blob.encode()).hexdigest()[:20]
    bf16 = dataclasses.replace(spec, precision="bf16-mixed")
    blob = json.dumps({**identity, "precision": "bf16-mixed"}, sort_keys=True, separators=(",", ":"), default=str)
    assert bf16.key == hashlib.sha256(blob.encode()).hexdigest()[:20]


@pytest.mark.skipif(not COMMITTED, reason="no committed records")
def test_every_committed_record_keeps_its_key():
    """Old records must keep counting: the key of each committed record's spec is still its key."""
    for path in COMMITTED:
        record = json.loads(path.read_text())
        assert RunSpec.from_dict(record["spec"]).key == record["key"] == path.stem, path.name


@pytest.mark.parametrize("field, value", [("task", "citeseer"), ("task_version", BASE.task_version + "-next"), ("variant", "gmm2"),
                                          ("variant_version", BASE.variant_version + "-next"), ("seed", 1)])
def test_each_identity_field_changes_the_key(field, value):
    assert dataclasses.replace(BASE, **{field: value}).key != BASE.key


@pytest.mark.parametrize("precision", [p for p in PRECISIONS if p != "32"])
def test_precision_changes_the_key(precision):
    keys = {make_spec("cora", "softmax", 0, precision=p).key for p in ("32", precision)}
    assert len(keys) == 2


@pytest.mark.parametrize("variant", list_attentions())
def test_every_attention_option_changes_the_key(variant):
    spec = make_spec("cora", variant, 0)
    options = [name for name in spec.attention if name != "name"]
    for name in options:
        changed = dataclasses.replace(spec, attention={**spec.attention, name: other_value(spec.attention[name])})
        assert changed.key != spec.key, (variant, name)


def test_every_task_parameter_changes_the_key():
    for task in ("cora", "glue-rte", "easy-vqa", "coco-captions"):
        spec = make_spec(task, "softmax", 0)
        assert spec.params, task
        for name, value in spec.params.items():
            changed = dataclasses.replace(spec, params={**spec.params, name: other_value(value)})
            assert changed.key != spec.key, (task, name)


def test_a_changed_option_reaches_the_key_through_make_spec():
    assert make_spec("cora", {"name": "gmm", "beta": 0.5}, 0).key != BASE.key
    assert make_spec("cora", "gmm", 0, {"lr": 0.01}).key != BASE.key
    # spelled out at its default, or as None ("the default"), an option is the same run
    _, config = resolve_config("gmm")
    assert make_spec("cora", {"name": "gmm", "beta": config.beta}, 0).key == BASE.key
    assert make_spec("cora", {"name": "gmm", "beta": None}, 0).key == BASE.key
    assert make_spec("cora", "gmm", 0, {"lr": get_task("cora").params().lr}).key == BASE.key


def test_versions_come_from_the_code_and_reach_the_key(monkeypatch):
    cls = attention_entry("gmm").cls
    monkeypatch.setattr(cls, "version", "test-bump")
    bumped = make_spec("cora", "gmm", 0)
    assert bumped.variant_version == "test-bump" and bumped.key != BASE.key
    monkeypatch.undo()
    task_cls = type(get_task("cora"))
    monkeypatch.setattr(task_cls, "version", "test-bump")
    bumped = make_spec("cora", "gmm", 0)
    assert bumped.task_version == "test-bump" and bumped.key != BASE.key


def test_labels_and_where_a_spec_came_from_do_not_change_the_key():
    relabelled = make_spec("cora", "gmm", 0, label="GMM (renamed)", extra={"suite": "another-suite", "tuning": {"trials": 20}})
    assert relabelled.key == BASE.key
    assert relabelled.display == "GMM (renamed)" and relabelled.extra == {"suite": "another-suite", "tuning": {"trials": 20}}
    plain = make_spec("cora", "gmm", 0)  # built here, not at import: the label default is what is tested
    assert plain.label == plain.display == "gmm" and plain.extra == {}
    assert make_spec("cora", "gmm", 0, precision="32").key == BASE.key


def test_a_spec_round_trips_through_its_dict_with_its_key():
    spec = make_spec("cora", {"name": "gmm", "beta": 0.5}, 2, {"lr": 0.01}, label="x", extra={"suite": "s"}, precision="bf16-mixed")
    data = spec.to_dict()
    assert sorted(data) == sorted(f.name for f in dataclasses.fields(RunSpec))
    assert (data["attention"], data["params"], data["extra"]) == (dict(spec.attention), dict(spec.params), {"suite": "s"})
    again = RunSpec.from_dict(json.loads(json.dumps(data)))
    assert again == spec and again.key == spec.key
    assert make_spec("cora", "gmm", "4").seed == 4


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision 'fp8': expected one of 32, bf16-mixed, 16-mixed$"):
        make_spec("cora", "softmax", 0, precision="fp8")


def test_attention_options_are_checked_and_converted_by_their_declared_types():
    from modules.validation import ConfigError

    with pytest.raises(ConfigError, match=r"^attention 'gmm': beta=-1.0: expected float >= 0$"):
        make_spec("cora", {"name": "gmm", "beta": -1.0}, 0)
    with pytest.raises(ConfigError, match=r"^attention 'gmm' has no option"):
        make_spec("cora", {"name": "gmm", "bta": 1.0}, 0)
    converted = make_spec("cora", {"name": "gmm", "beta": "0.5"}, 0)  # a string from --set, converted by the field's type
    assert converted.attention["beta"] == 0.5 and isinstance(converted.attention["beta"], float)
    assert converted.key == make_spec("cora", {"name": "gmm", "beta": 0.5}, 0).key
    with pytest.raises(ValueError, match="has no 'name'"):
        make_spec("cora", {"beta": 0.5}, 0)
