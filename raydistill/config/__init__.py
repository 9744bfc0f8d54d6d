"""raydistill's settings: the job config (``job.py``: JobConfig; its sections in ``sections.py``, YAML loading with
file and line in every error and ``--set a.b=c`` in ``loading.py``, the old ``extra.<runtime knob>`` spellings in
``runtime_knobs.py``, all re-exported by ``job.py``), the sweep settings (``sweep.py``), the schema library under them
(``schema.py``) and the ``--help`` text generated from it (``help.py``).

It sits below ``methods/`` and ``runtime/``: it imports only ``data``, ``augment`` and ``fileio``, so a method may
declare and check its own settings against it without importing the Ray layer. The methods register their
settings schemas here (``help.register_method``) for ``--help``.

The schema library is pydantic (2.x, already installed as an MLflow dependency; ``schema.py`` says how): pydantic
*dataclasses* rather than ``BaseModel``, so the sections stay real dataclasses (``dataclasses.fields``/``asdict``/
``replace``, keyword construction and ``==`` keep working) while validation and field documentation come from
pydantic.
"""
