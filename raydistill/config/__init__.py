"""raydistill's settings: the job config (``job.py``: JobConfig; its sections in ``sections.py``, YAML loading with
file and line in every error and ``--set a.b=c`` in ``loading.py``, the old ``extra.<runtime knob>`` spellings in
``runtime_knobs.py``, all re-exported by ``job.py``), the sweep settings (``sweep.py``), the schema library under them
(``schema.py``) and the ``--help`` text generated from it (``help.py``).

It sits below ``methods/`` and ``runtime/``: it imports only ``data``, ``augment`` and ``fileio``, so a method may
declare and check its own settings against it without importing the Ray layer. The methods register their
settings schemas here (``help.register_method``) for ``--help``.

The schema library is pydantic (2.x, already installed as an MLflow dependency): every section is a
``pydantic.dataclasses.dataclass`` with ``extra="forbid"`` and ``allow_inf_nan=False``, its fields typed, ranged
and described with ``Field``. Pydantic *dataclasses* rather than ``BaseModel``: the sections stay real dataclasses,
so ``dataclasses.fields``/``asdict``/``replace``, keyword construction (``RoleResources(num_cpus=0)``) and ``==``
keep working in the runtime, the tests and the scripts that use them that way, while validation, JSON schema and
field documentation come from pydantic. ``schema.build`` words pydantic's errors the way this project always has
(``<file>:<line>: field '<path>': ...``, "did you mean"), one problem at a time.
"""
