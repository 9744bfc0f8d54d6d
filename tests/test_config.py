"""JobConfig: YAML round trip, --set overrides, strict keys, semantic validation, config_hash. (The schema library
under it, the methods' settings schemas and the runtime section: tests/test_config_schema.py.)"""

from __future__ import annotations

import re
import textwrap

import pytest

from raydistill.runtime.engine.cluster import ResourceError, check_resources
from raydistill.config.job import ConfigError, JobConfig
from raydistill.runtime.engine.preflight import preflight

pytest_plugins = ["tests.reliability_log"]

CONGEN_YAML = """\
method: congen
student: bert-tiny
teacher: minilm-l6
data:
  corpus: flickr
  max_sentences: 2000
  views: {control: none, generalize: "delete:0.1"}
  teacher_views: [control]
train:
  batch_size: 64
  lr: 3e-4
loss:
  queue_size: 1024
  tau_teacher: 0.05
  tau_student: 0.07
resources:
  teacher: {num_actors: 1, num_cpus: 1, threads: 1}
  data: {max_cpus: 0.5}
"""


@pytest.fixture
def congen_file(tmp_path):
    path = tmp_path / "congen.yaml"
    path.write_text(CONGEN_YAML)
    return path


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_yaml_round_trip(congen_file, tmp_path):
    cfg = JobConfig.from_yaml(congen_file)
    assert cfg.train.lr == pytest.approx(3e-4)  # "3e-4" is a string to PyYAML; read as a number anyway
    assert cfg.resources.data_max_cpus == 0.5 and cfg.resources.teacher.num_cpus == 1.0
    assert cfg.data.views == {"control": "none", "generalize": "delete:0.1"}
    assert cfg.train.epochs == 1 and cfg.resources.learner.num_learners == 0  # defaults filled in
    again = JobConfig.from_yaml(_write(tmp_path / "again.yaml", cfg.to_yaml()))
    assert again == cfg and again.to_dict() == cfg.to_dict()
    assert again.config_hash() == cfg.config_hash()


def _write(path, text):
    path.write_text(text)
    return path


def test_set_overrides_parse_values_as_yaml(congen_file):
    cfg = JobConfig.from_yaml(congen_file, overrides=["train.lr=1e-4", "loss.queue_size=4096", "train.max_steps=50",
                                                      "data.views.generalize=caption", "extra.bucket_tokens=64",
                                                      "teacher=null"])
    assert cfg.train.lr == pytest.approx(1e-4)
    assert cfg.loss.queue_size == 4096 and cfg.train.max_steps == 50
    assert cfg.data.views == {"control": "none", "generalize": "caption"}
    assert cfg.extra.bucket_tokens == 64 and dict(cfg.extra) == {"bucket_tokens": 64} and cfg.teacher is None
    later = cfg.with_overrides(["train.batch_size=32"])
    assert later.train.batch_size == 32 and cfg.train.batch_size == 64


def test_unknown_key_names_file_line_and_closest_field(tmp_path):
    text = CONGEN_YAML.replace("  lr: 3e-4", "  learning_rat: 3e-4")
    path = _write(tmp_path / "typo.yaml", text)
    with pytest.raises(ConfigError) as err:
        JobConfig.from_yaml(path)
    message = str(err.value)
    assert f"{path}:{_line_of(text, 'learning_rat')}:" in message
    assert "field 'train.learning_rat': unknown field" in message
    assert "allowed in train:" in message and "lr" in message

    with pytest.raises(ConfigError, match=r"--set field 'train\.bach_size': unknown field \(did you mean 'batch_size'"):
        JobConfig.from_yaml(_write(tmp_path / "ok.yaml", CONGEN_YAML), overrides=["train.bach_size=3"])
    with pytest.raises(ConfigError, match=r"field 'resources\.teacher\.num_gpu': unknown field \(did you mean 'num_gpus'"):
        JobConfig.from_dict({"method": "congen", "student": "bert-tiny", "resources": {"teacher": {"num_gpu": 1}}})
    with pytest.raises(ConfigError, match=r"field 'techer': unknown field \(did you mean 'teacher'"):
        JobConfig.from_dict({"method": "congen", "student": "bert-tiny", "techer": "minilm-l6"})


def test_wrong_types_and_bad_overrides_are_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"field 'train\.batch_size': expected an integer, got 'many'"):
        JobConfig.from_dict({"method": "congen", "student": "bert-tiny", "train": {"batch_size": "many"}})
    with pytest.raises(ConfigError, match=r"field 'tracking\.enabled': expected true or false"):
        JobConfig.from_dict({"method": "congen", "student": "bert-tiny", "tracking": {"enabled": "yes please"}})
    with pytest.raises(ConfigError, match="missing required field.*student"):
        JobConfig.from_dict({"method": "congen"})
    with pytest.raises(ConfigError, match="expected key.path=value"):
        JobConfig.from_yaml(_write(tmp_path / "c.yaml", CONGEN_YAML), overrides=["train.lr"])
    bad_yaml = _write(tmp_path / "bad.yaml", "method: congen\nstudent: [unclosed\n")
    with pytest.raises(ConfigError, match=rf"{bad_yaml}:\d+: not valid YAML"):
        JobConfig.from_yaml(bad_yaml)


def test_validate_accepts_a_good_config(congen_file):
    assert preflight(JobConfig.from_yaml(congen_file)).method == "congen"


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("loss.queue_size=32", r"field 'loss\.queue_size': K=32 is smaller than train\.batch_size=64"),
        ("loss.tau_teacher=0", r"field 'loss\.tau_teacher': temperature must be a number > 0, got 0"),
        ("loss.tau_student=-0.05", r"field 'loss\.tau_student': temperature must be a number > 0, got -0\.05"),
        ("loss.queue_size=-1", r"field 'loss\.queue_size': -1 must be >= 0"),
        ("train.batch_size=0", r"field 'train\.batch_size': must be > 0, got 0"),
        ("train.warmup_ratio=1.5", r"field 'train\.warmup_ratio': 1\.5 must be in \[0, 1\)"),
        ("data.max_sentences=-5", r"field 'data\.max_sentences': must be > 0"),
        ("data.teacher_views=[contrl]", r"field 'data\.teacher_views': 'contrl' is not a view \(did you mean 'control'"),
        ("data.corpus=flikr", r"field 'data\.corpus': 'flikr' \(did you mean 'flickr'\?\); allowed: flickr, nli"),
        ("data.corpus=file:/no/such/file.txt", r"training file not found: /no/such/file\.txt"),
        ("student_pooling=max", r"field 'student_pooling': 'max' is not one of mean, cls"),
        ("data.views.generalize=delet:0.1", r"field 'data\.views\.generalize': unknown augmentation 'delet'"),
        ("data.views.generalize=delete:1.5", r"field 'data\.views\.generalize': spec 'delete:1\.5': ratio must be"),
        ("data.views.generalize=paired:/no/such.jsonl", r"paraphrase file not found: /no/such\.jsonl"),
        ("resources.data_max_cpus=0.1", r"field 'resources\.data_max_cpus': 0\.1 is below 0\.5"),
        ("resources.teacher.num_actors=0", r"field 'resources\.teacher\.num_actors': must be > 0"),
        ("loss.queue_init=teachr", r"field 'loss\.queue_init': 'teachr' is not one of empty, random, teacher "
                                   r"\(did you mean 'teacher'\?\)"),
    ],
)
def test_validate_rejects(congen_file, override, pattern):
    """Types and ranges are refused as the config loads, the rest by preflight: both before anything starts."""
    with pytest.raises(ConfigError, match=pattern):
        preflight(JobConfig.from_yaml(congen_file, overrides=[override]))


def test_a_caption_view_of_a_corpus_without_captions_is_refused_naming_the_view(congen_file):
    cfg = JobConfig.from_yaml(congen_file, overrides=["data.corpus=nli", "data.views.generalize=caption"])
    with pytest.raises(ConfigError, match=r"field 'data\.views\.generalize': 'caption' shows another caption .* "
                                          r"corpus 'nli' has no caption groups"):
        preflight(cfg)
    assert preflight(cfg.with_overrides(["data.corpus=flickr"])).data.views["generalize"] == "caption"


def test_a_learned_ckd_scale_at_its_clamp_floor_is_refused_before_anything_starts(congen_file):
    cfg = JobConfig.from_yaml(congen_file, overrides=["method=ckd", "data.views={a: none}", "data.teacher_views=[a]",
                                                     "loss={queue_size: 4096, temperature: 1.0}"])
    with pytest.raises(ConfigError, match=r"field 'loss\.temperature': .*cannot start at its clamp bound"):
        preflight(cfg)
    assert preflight(cfg.with_overrides(["loss={queue_size: 4096, temperature: 0.367879}"])).method == "ckd"


def test_validate_error_points_at_the_line_of_the_file(tmp_path):
    text = CONGEN_YAML.replace("tau_teacher: 0.05", "tau_teacher: 0")
    path = _write(tmp_path / "tau.yaml", text)
    with pytest.raises(ConfigError) as err:
        preflight(JobConfig.from_yaml(path))
    assert str(err.value).startswith(f"{path}:{_line_of(text, 'tau_teacher')}: field 'loss.tau_teacher'")


def test_unknown_preset_lists_the_presets(congen_file):
    from raydistill.models.registry import PRESETS

    cfg = JobConfig.from_yaml(congen_file, overrides=["student=bert-tiyn"])
    with pytest.raises(ConfigError) as err:
        preflight(cfg)
    message = str(err.value)
    assert "field 'student'" in message and "did you mean 'bert-tiny'" in message
    assert all(name in message for name in PRESETS)
    with pytest.raises(ConfigError, match="field 'teacher': model directory not found: ./no/such/model"):
        preflight(JobConfig.from_yaml(congen_file, overrides=["teacher=./no/such/model"]))


def test_model_directory_is_accepted(congen_file, tmp_path):
    (tmp_path / "my-model").mkdir()
    cfg = JobConfig.from_yaml(congen_file, overrides=[f"student={tmp_path / 'my-model'}"])
    assert preflight(cfg).student == str(tmp_path / "my-model")


def test_missing_config_file_is_a_clear_error(congen_file):
    with pytest.raises(ConfigError, match=r"config file not found: .*congen\.yml; did you mean .*congen\.yaml"):
        JobConfig.from_yaml(congen_file.with_suffix(".yml"))
    with pytest.raises(ConfigError, match="config file not found: /no/such/dir/x.yaml"):
        JobConfig.from_yaml("/no/such/dir/x.yaml")


def test_validate_is_the_schema_only_and_preflight_checks_the_machine(congen_file, tmp_path):
    """validate() reads no file and knows no method; preflight adds the method's rules, models and files."""
    cfg = JobConfig.from_yaml(congen_file, overrides=["student=./no/such/model", "data.corpus=file:/no/such.txt",
                                                     "method=congne"])
    assert cfg.validate() is cfg
    with pytest.raises(ConfigError, match=r"field 'method': unknown method 'congne' \(did you mean 'congen'\?\)"):
        preflight(cfg)
    with pytest.raises(ConfigError, match=r"field 'data\.views': method 'congen' reads the view\(s\) \['generalize'\]"):
        preflight(cfg.with_overrides(["method=congen", "data.views={control: none}", "data.teacher_views=[control]"]))
    with pytest.raises(ConfigError, match="field 'student': model directory not found: ./no/such/model"):
        preflight(cfg.with_overrides(["method=congen"]))
    with pytest.raises(ConfigError, match=r"field 'data\.corpus': training file not found: /no/such\.txt"):
        preflight(cfg.with_overrides(["method=congen", "student=bert-tiny"]))


def test_config_hash_is_stable_and_ignores_resources_and_tracking(congen_file):
    cfg = JobConfig.from_yaml(congen_file)
    same = JobConfig.from_yaml(congen_file)
    assert cfg.config_hash() == same.config_hash()
    assert len(cfg.config_hash()) == 16
    ignored = cfg.with_overrides(["resources.teacher.num_actors=4", "resources.learner.num_gpus=1",
                                  "resources.num_cpus=64", "tracking.experiment=other", "tracking.enabled=false",
                                  "train.eval_every=7", "run_dir=/somewhere/else"])
    assert ignored.config_hash() == cfg.config_hash()
    assert ignored.diff_keys(cfg) == []
    changed = cfg.with_overrides(["train.lr=1e-3", "loss.tau_student=0.05"])
    assert changed.config_hash() != cfg.config_hash()
    assert changed.diff_keys(cfg) == ["loss.tau_student", "train.lr"]
    assert cfg.config_hash(exclude=()) != ignored.config_hash(exclude=())


def test_train_precision_is_validated_and_hashed_only_when_not_fp32(congen_file):
    cfg = JobConfig.from_yaml(congen_file)
    assert cfg.train.precision == "fp32"
    # a field added after run directories existed: at its default it must not change their hash (resume keeps working)
    assert "precision" not in cfg.hashed_fields()["train"]
    assert cfg.with_overrides(["train.precision=fp32"]).config_hash() == cfg.config_hash()
    bf16 = cfg.with_overrides(["train.precision=bf16"]).validate()
    assert bf16.hashed_fields()["train"]["precision"] == "bf16"
    assert bf16.config_hash() != cfg.config_hash() and bf16.diff_keys(cfg) == ["train.precision"]
    with pytest.raises(ConfigError, match=r"field 'train\.precision': 'fp16' is not one of fp32, bf16"):
        cfg.with_overrides(["train.precision=fp16"]).validate()


def test_config_hash_is_the_same_in_another_process(congen_file):
    import subprocess
    import sys

    code = f"from raydistill.config.job import JobConfig; print(JobConfig.from_yaml({str(congen_file)!r}).config_hash())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert other.stdout.strip() == JobConfig.from_yaml(congen_file).config_hash()


def test_check_resources_names_what_does_not_fit(congen_file):
    cfg = JobConfig.from_yaml(congen_file)
    check_resources(cfg, {"CPU": 2})
    two_full_learners = cfg.with_overrides(["resources.learner.num_learners=2", "resources.learner.num_cpus=1"])
    with pytest.raises(ResourceError, match=r"learners 2 x 1 CPU .* Ray Data headroom 0\.5 CPU = 2\.5 CPU > 2"):
        check_resources(two_full_learners, {"CPU": 2})
    check_resources(cfg.with_overrides(["resources.learner.num_learners=2", "resources.learner.num_cpus=0.5"]),
                    {"CPU": 2})
    with pytest.raises(ResourceError, match="teacher pool asks for 1 GPU"):
        check_resources(cfg.with_overrides(["resources.teacher.num_gpus=1"]), {"CPU": 2})
    check_resources(cfg.with_overrides(["resources.teacher.num_gpus=1", "resources.teacher.num_actors=4"]),
                    {"CPU": 16, "GPU": 4})


def test_default_run_and_cache_dirs(congen_file, monkeypatch, tmp_path):
    monkeypatch.setenv("RAYDISTILL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    cfg = JobConfig.from_yaml(congen_file)
    assert cfg.resolved_run_dir() == tmp_path / "runs" / "congen-bert-tiny-minilm-l6"
    assert cfg.resolved_cache_dir() == tmp_path / "home" / "embeddings"
    assert textwrap.dedent(cfg.to_yaml()).startswith("method: congen\n")


def test_outputs_inside_a_ray_job_working_dir_copy_are_warned_about(tmp_path, monkeypatch, capsys):
    """`ray job submit --working-dir .` runs the job in a temporary copy; defaults relative to it would be lost."""
    from raydistill.runtime.engine.cluster import warn_if_outputs_are_ephemeral

    copy = tmp_path / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    warned = warn_if_outputs_are_ephemeral({"run dir": copy / "runs" / "x", "results dir": tmp_path / "results",
                                            "MLflow store": f"sqlite:///{copy / 'mlflow.db'}"})
    assert warned == ["run dir", "MLflow store"]
    assert "MLFLOW_TRACKING_URI" in capsys.readouterr().out

    monkeypatch.chdir(tmp_path)  # an ordinary checkout: nothing to say
    assert warn_if_outputs_are_ephemeral({"run dir": tmp_path / "runs"}) == []


# ----------------------------------------------------------------------------------------------------------------
# The shipped configs


CONFIG_DIR = __import__("raydistill.shipped", fromlist=["configs_dir"]).configs_dir()


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads_and_validates(path):
    """A shipped config that no longer matches its dataclass (a renamed field, a value out of range) fails here,
    not when a user starts a job."""
    from raydistill.runtime.tenc import TencConfig

    if "tenc" in path.name:
        cfg = TencConfig.from_yaml(path).validate()
        assert cfg.cross.head in (None, "classifier", "segment_cosine")
    elif path.name.startswith("st_mse"):
        from raydistill.runtime.jobs.st_mse import preflight_st_mse

        preflight_st_mse(JobConfig.from_yaml(path, []))
    else:
        preflight(JobConfig.from_yaml(path, []))


def test_non_finite_numbers_and_mistyped_runtime_settings_are_refused_before_ray(tmp_path, congen_file,
                                                                                  reliability):
    from raydistill.runtime.tenc.config import TencConfig

    text = CONGEN_YAML.replace("lr: 3e-4", "lr: .nan")
    nan_lr = _write(tmp_path / "nan.yaml", text)
    cases = [  # (how the config is made, the error it must raise)
        (lambda: JobConfig.from_yaml(nan_lr),
         rf"{nan_lr}:{_line_of(text, 'lr: .nan')}: field 'train\.lr': expected a finite number, got nan"),
        (lambda: JobConfig.from_yaml(congen_file, overrides=["train.lr=.inf"]), r"--set field 'train\.lr'"),
        (lambda: JobConfig.from_yaml(congen_file, overrides=["train.grad_clip=nan"]), r"field 'train\.grad_clip'"),
        (lambda: JobConfig.from_yaml(congen_file, overrides=["loss.tau_teacher=-.inf"]), r"field 'loss\.tau_teacher'"),
        (lambda: TencConfig.from_dict({"families": ["bert-tiny"], "bi": {"lr": float("inf")}}), r"field 'bi\.lr'"),
        (lambda: TencConfig.from_dict({"families": ["bert-tiny"], "label_weight_temperature": "nan"}),
         r"field 'label_weight_temperature'"),
    ]
    runtime = [("runtime.max_restarts='x'", r"field 'runtime\.max_restarts': expected an integer, got 'x'"),
               ("runtime.max_restarts=-1", r"field 'runtime\.max_restarts': -1 must be >= 0"),
               ("runtime.learner_timeout_s=-1", r"field 'runtime\.learner_timeout_s': must be > 0, got -1"),
               ("runtime.log_every=0", r"field 'runtime\.log_every': 0 must be >= 1"),
               ("runtime.storage_path=5", r"field 'runtime\.storage_path': expected a string, got 5"),
               ("runtime.storage_path=' '", r"field 'runtime\.storage_path': must be a non-empty path"),
               # the spelling of configs written before the runtime section: moved there, checked the same way
               ("extra.max_restarts=-1", r"field 'runtime\.max_restarts': -1 must be >= 0")]
    cases += [(lambda override=override: preflight(JobConfig.from_yaml(congen_file, overrides=[override])), pattern)
              for override, pattern in runtime]
    messages = []
    for make, pattern in cases:
        try:
            make()
            messages.append("accepted")
        except ConfigError as exc:
            messages.append(str(exc))
    reliability.record(
        "config", "config-nonfinite-refused",
        input="train.lr: .nan in the YAML file; --set train.lr=.inf, train.grad_clip=nan, loss.tau_teacher=-.inf; "
              "Trans-Encoder bi.lr inf and label_weight_temperature 'nan'; runtime.max_restarts 'x' and -1, "
              "runtime.learner_timeout_s -1, runtime.log_every 0, runtime.storage_path 5 and ' ', "
              "extra.max_restarts -1 (the old spelling)",
        did="each refused (ConfigError) while the config loads or in preflight, before Ray starts, naming the file "
            "and line (or --set) and the field",
        message=" / ".join(messages), lost="nothing: refused before the job started")
    for (_, pattern), message in zip(cases, messages):
        assert re.search(pattern, message), (pattern, message)


@pytest.fixture(autouse=True)
def _old_spellings_warn_quietly():
    """The extra.<runtime knob> cases above warn (ConfigDeprecationWarning); test_config_schema.py checks that."""
    import warnings

    from raydistill.config.job import ConfigDeprecationWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigDeprecationWarning)
        yield
