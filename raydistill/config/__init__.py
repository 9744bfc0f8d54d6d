"""raydistill's settings: the job config (``job.py``, which re-exports its sections in ``sections.py``, the YAML
loading with file and line in every error and ``--set a.b=c`` of ``loading.py`` and the old ``extra.<runtime knob>``
spellings of ``runtime_knobs.py``), the sweep settings (``sweep.py``), the schema library under them (``schema.py``)
and the ``--help`` text generated from it (``help.py``, where the methods register their settings schemas).

It sits below ``methods/`` and ``runtime/``: it imports only ``data``, ``augment`` and ``fileio``, so a method may
declare and check its own settings against it without importing the Ray layer. The schema library is pydantic
(2.x, already installed as an MLflow dependency) *dataclasses* rather than ``BaseModel``, so the sections stay real
dataclasses (``dataclasses.fields``/``asdict``/``replace``, keyword construction and ``==`` keep working).
"""
