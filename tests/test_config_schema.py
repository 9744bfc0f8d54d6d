"""The config's schema library: each method's ``loss:``/``extra:`` schema, the ``runtime:`` section (and the old
``extra.<knob>`` spelling it replaces), and the hash of configs across that move. (That ``raydistill.config`` imports
no method or runtime module: tests/test_imports.py.)
"""

from __future__ import annotations

import inspect
import json
import warnings

import pytest

from raydistill.config.job import (
    ConfigDeprecationWarning,
    ConfigError,
    JobConfig,
    RUNTIME_KNOBS,
    hashed_fields_of,
)
from raydistill.methods import METHODS, validate_method

CONGEN = {"method": "congen", "student": "bert-tiny", "teacher": "minilm-l6",
          "data": {"views": {"control": "none", "generalize": "delete:0.1"}, "teacher_views": ["control"]},
          "train": {"batch_size": 64}, "loss": {"queue_size": 1024}}


def _congen(**sections) -> JobConfig:
    plain = json.loads(json.dumps(CONGEN))
    for name, value in sections.items():
        plain[name] = {**plain.get(name, {}), **value} if isinstance(value, dict) else value
    return JobConfig.from_dict(plain)


# ----------------------------------------------------------------------------------------------------------------
# The methods' settings schemas


@pytest.mark.parametrize("method", sorted(METHODS))
def test_each_method_declares_the_settings_its_loss_takes(method):
    """The schema is the method's (no key-name guesses): its keys are the loss's own parameters, and its defaults
    validate against it."""
    spec = METHODS[method]
    declared = set(spec.loss_settings.__pydantic_fields__)
    params = inspect.signature(spec.loss_class).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        context = {"dim", "queue", "total_steps", "precision"}  # filled in by the runtime, never by the config
        assert declared <= set(params) - context, declared - set(params)
    from raydistill.config.schema import build

    build(spec.loss_settings, dict(spec.default_loss))


def test_the_queue_start_values_are_the_queues():
    import typing

    from raydistill.methods.base import QueueInit
    from raydistill.objectives.queue import QUEUE_INITS

    assert typing.get_args(QueueInit) == QUEUE_INITS


@pytest.mark.parametrize("loss, pattern", [
    # values the old key-name guesses let through, up to the loss's constructor or beyond
    ({"alpha": 1.5}, r"field 'loss\.alpha': 1\.5 must be in \[0, 1\]"),
    ({"mask_same_group": "maybe"}, r"field 'loss\.mask_same_group': expected true or false, got 'maybe'"),
    ({"queue_seed": 0.5}, r"field 'loss\.queue_seed': expected an integer, got 0\.5"),
    ({"precision": "bf16"}, r"field 'loss\.precision': unknown field for the congen loss; allowed in loss: "
                            r"queue_size, tau_teacher"),
    ({"tau_teacher": True}, r"field 'loss\.tau_teacher': expected a number, got True"),
    # an unknown key: the closest setting
    ({"tau_techer": 0.05}, r"field 'loss\.tau_techer': unknown field for the congen loss \(did you mean "
                           r"'tau_teacher'\?\)"),
])
def test_a_loss_setting_is_checked_by_the_methods_schema(loss, pattern):
    with pytest.raises(ConfigError, match=pattern):
        validate_method(_congen(loss=loss))


def test_sct_distill_objective_and_projector_are_typed():
    base = {"method": "sct-distill", "student": "bert-tiny", "teacher": "minilm-l6", "train": {"batch_size": 64}}
    with pytest.raises(ConfigError, match=r"field 'loss\.objective': 'cd-only' is not one of joint, cd_only "
                                          r"\(did you mean 'cd_only'\?\)"):
        validate_method(JobConfig.from_dict({**base, "loss": {"objective": "cd-only"}}))
    with pytest.raises(ConfigError, match=r"field 'loss\.projector_blocks': 0 must be >= 1"):
        validate_method(JobConfig.from_dict({**base, "loss": {"projector_blocks": 0}}))
    assert validate_method(JobConfig.from_dict({**base, "loss": {"objective": "cd_only"}})).loss["objective"] \
        == "cd_only"


def test_a_numeric_string_is_the_number_and_an_int_keeps_its_spelling():
    """YAML 1.1 reads 1e-2 (no dot) as a string; the loss gets the number. An int stays an int: the config hash
    of runs that wrote one stays theirs."""
    effective = validate_method(_congen(loss={"tau_teacher": "5e-2", "tau_student": 1}))
    assert effective.loss["tau_teacher"] == 0.05 and effective.loss["tau_student"] == 1
    assert isinstance(effective.loss["tau_student"], int)


def test_method_schema_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "congen.yaml"
    path.write_text("method: congen\nstudent: bert-tiny\nteacher: minilm-l6\ntrain:\n  batch_size: 64\n"
                    "loss:\n  queue_size: 1024\n  tau_techer: 0.05\n")
    with pytest.raises(ConfigError) as caught:
        validate_method(JobConfig.from_yaml(path))
    assert str(caught.value).startswith(f"{path}:8: field 'loss.tau_techer': unknown field for the congen loss "
                                        "(did you mean 'tau_teacher'?)")


def test_extra_settings_are_the_methods(tmp_path):
    with pytest.raises(ConfigError, match=r"field 'extra\.stage2': unknown field for method 'congen'"):
        validate_method(_congen(extra={"stage2": {"train": {"lr": 1e-5}}}))
    with pytest.raises(ConfigError, match=r"field 'extra\.teacher_encoder': 'bi-encoder' is not one of bi, cross"):
        validate_method(_congen(extra={"teacher_encoder": "bi-encoder"}))
    dvbert = {"method": "dvbert", "student": "bert-tiny"}
    with pytest.raises(ConfigError, match=r"field 'extra\.teacher_training\.hed': unknown field .*did you mean "
                                          r"'head'"):
        validate_method(JobConfig.from_dict({**dvbert, "extra": {"teacher_training": {"hed": "cls"}}}))
    with pytest.raises(ConfigError, match=r"field 'extra\.teacher_training\.folds': 1 must be >= 2"):
        validate_method(JobConfig.from_dict({**dvbert, "extra": {"teacher_training": {"folds": 1}}}))
    with pytest.raises(ConfigError, match=r"field 'extra\.teachers': lists a teacher twice"):
        validate_method(JobConfig.from_dict({**dvbert, "extra": {"teachers": ["minilm-l6", "minilm-l6"]}}))
    extra = validate_method(JobConfig.from_dict({**dvbert, "extra": {"teacher_training": {"folds": 3}}})).extra
    assert extra.teacher_training.folds == 3 and dict(extra) == {"teacher_training": {"folds": 3}}


def test_the_run_summary_and_the_teacher_read_the_settings_in_use_defaults_included():
    from raydistill.runtime.jobs.distill import _summary_params
    from raydistill.runtime.teachers.teacher import TeacherSpec

    params = _summary_params(_congen())  # the config sets the queue size, not the temperatures
    assert (params["tau_teacher"], params["tau_student"], params["K"]) == (0.05, 0.07, 1024)
    assert TeacherSpec.from_config(_congen()).encoder == "bi"
    assert TeacherSpec.from_config(_congen(extra={"teacher_encoder": "cross"})).encoder == "cross"


# ----------------------------------------------------------------------------------------------------------------
# The runtime section


def test_runtime_knobs_have_a_section_of_their_own():
    cfg = _congen(runtime={"max_restarts": 5, "learner_timeout_s": 30, "log_every": 2, "storage_path": "/tmp/s"})
    assert (cfg.runtime.max_restarts, cfg.runtime.learner_timeout_s, cfg.runtime.log_every,
            cfg.runtime.storage_path) == (5, 30.0, 2, "/tmp/s")
    assert dict(cfg.extra) == {} and cfg.to_dict()["runtime"]["max_restarts"] == 5
    assert "max_restarts" not in cfg.extra and not _congen().extra  # read from cfg.runtime only
    # the hash and the resume check ignore them, as they ignored extra.<knob>
    assert cfg.config_hash() == _congen().config_hash() and cfg.diff_keys(_congen()) == []


def test_an_old_config_with_knobs_under_extra_loads_with_one_deprecation_line_each(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("method: congen\nstudent: bert-tiny\nteacher: minilm-l6\nextra:\n  max_restarts: 6\n"
                    "  log_every: 5\n")
    with pytest.warns(ConfigDeprecationWarning) as caught:
        cfg = JobConfig.from_yaml(path)
    messages = [(str(w.message), w.filename, w.lineno) for w in caught]
    assert messages == [
        ("extra.max_restarts is deprecated: it moved to runtime.max_restarts; write it there (the old spelling "
         "still loads)", str(path), 5),
        ("extra.log_every is deprecated: it moved to runtime.log_every; write it there (the old spelling still "
         "loads)", str(path), 6)]
    assert (cfg.runtime.max_restarts, cfg.runtime.log_every, dict(cfg.extra)) == (6, 5, {})
    new = JobConfig.from_dict({"method": "congen", "student": "bert-tiny", "teacher": "minilm-l6",
                               "runtime": {"max_restarts": 6, "log_every": 5}})
    assert cfg == new and cfg.config_hash() == new.config_hash()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the saved config is in the new spelling: loading it again says nothing
        assert JobConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.warns(ConfigDeprecationWarning) as caught:
        JobConfig.from_yaml(path, ["extra.storage_path=/s"])
    assert "--set extra.storage_path is deprecated: it moved to runtime.storage_path" in str(caught[-1].message)


def test_a_knob_set_in_both_places_differently_is_refused():
    with pytest.raises(ConfigError, match=r"field 'extra\.max_restarts': moved to runtime\.max_restarts, which this "
                                          r"config also sets \(2\); keep runtime\.max_restarts only"):
        _congen(extra={"max_restarts": 5}, runtime={"max_restarts": 2})


def test_a_checkpoint_of_an_older_config_resumes_under_the_new_one():
    """A manifest's stored config from before the runtime section (knobs under extra) trains the same thing."""
    new = _congen(runtime={"max_restarts": 6, "storage_path": "/s"})
    stored = new.to_dict()
    del stored["runtime"]
    stored["extra"] = {"max_restarts": 2, "learner_timeout_s": 60, "log_every": 1, "storage_path": "/s"}
    assert new.diff_keys(stored) == []
    assert hashed_fields_of(stored) == new.hashed_fields()
    assert set(RUNTIME_KNOBS) == {"max_restarts", "learner_timeout_s", "log_every", "storage_path"}


def test_a_stage_config_carries_the_runtime_section():
    from raydistill.methods import stage_plan

    cfg = JobConfig.from_dict({"method": "distilcse", "student": "bert-tiny", "teacher": "minilm-l6",
                               "runtime": {"max_restarts": 7, "log_every": 3}})
    stages = stage_plan(validate_method(cfg))
    assert [s.cfg.runtime.max_restarts for s in stages] == [7, 7]
    assert stages[1].cfg.runtime.log_every == 3


# ----------------------------------------------------------------------------------------------------------------
# The schema itself


def test_the_schema_is_a_pydantic_schema_with_every_field_described():
    from pydantic import TypeAdapter

    schema = TypeAdapter(JobConfig).json_schema()
    assert schema["additionalProperties"] is False and "runtime" in schema["properties"]
    train = schema["$defs"]["TrainConfig"]["properties"]["batch_size"]
    assert train["exclusiveMinimum"] == 0 and train["description"] == "rows per training step"
    # pydantic's lax int and float take true/false for 1/0; a config never means that
    with pytest.raises(ConfigError, match=r"field 'train\.lr': expected a finite number, got True"):
        JobConfig.from_dict({**CONGEN, "train": {"lr": True}})
    with pytest.raises(ConfigError, match=r"field 'train\.epochs': expected an integer, got False"):
        JobConfig.from_dict({**CONGEN, "train": {"epochs": False}})


def test_sweep_settings_and_space_files_are_on_the_same_schema(tmp_path):
    from raydistill.config.help import config_field_rows
    from raydistill.config.sweep import ALGORITHMS, SCHEDULERS, SweepSettings
    from raydistill.runtime.tune.space import SpaceError, SpaceFile, load_space

    assert [path for path, meaning in config_field_rows(SweepSettings) if not meaning] == []
    assert [path for path, meaning in config_field_rows(SpaceFile) if not meaning] == []
    fields = SweepSettings.__pydantic_fields__
    assert (fields["algorithm"].annotation.__args__, fields["scheduler"].annotation.__args__) == (ALGORITHMS,
                                                                                                  SCHEDULERS)
    with pytest.raises(ValueError, match=r"unknown setting 'num_sample' \(did you mean 'num_samples'\?\)"):
        SweepSettings.check_field("num_sample", 3)
    space = tmp_path / "space.yaml"
    space.write_text("search:\n  num_samples: 4\nscheduler:\n  name: pbt\n  quantile_fraction: 0.7\n"
                     "methods:\n  congen:\n    space:\n      train.lr: {choice: [1.0e-4]}\n")
    with pytest.raises(SpaceError, match=rf"{space}:5: field 'scheduler\.quantile_fraction': expected a number in "
                                         r"\(0, 0\.5\], got 0\.7"):
        load_space(space)


def test_the_old_spelling_on_the_command_line_overrides_a_saved_config():
    """A saved config (to_dict: every runtime field, defaults included) takes --set extra.<knob> like any override."""
    saved = _congen(runtime={"max_restarts": 6})
    with pytest.warns(ConfigDeprecationWarning):
        again = saved.with_overrides(["extra.max_restarts=7", "extra.storage_path=/s"])
    assert (again.runtime.max_restarts, again.runtime.storage_path) == (7, "/s")
    with pytest.warns(ConfigDeprecationWarning):
        assert JobConfig.from_dict({**saved.to_dict(), "extra": {"log_every": 4}}).runtime.log_every == 4


def test_the_schemas_allowed_values_are_the_code_paths():
    """The Literal types of the schema name exactly what the code below them accepts."""
    import typing

    from raydistill.config.job import JobConfig as Job, RoleResources
    from raydistill.models.bi_encoder import PROJECTION_INITS
    from raydistill.runtime.teachers.teacher import PRECISIONS

    fields = Job.__pydantic_fields__
    assert set(typing.get_args(fields["student_projection_init"].annotation)) == {*PROJECTION_INITS, "least_squares"}
    assert set(typing.get_args(RoleResources.__pydantic_fields__["precision"].annotation)) == set(PRECISIONS)
