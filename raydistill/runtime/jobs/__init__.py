"""The jobs that train a student, each a function of a validated config:

    distill.py          run_distillation: every distillation method (teacher pass, learners, evaluation, result)
    st_mse.py           sentence-transformers' own MSE distillation recipe, the baseline
    st_mse_recipe.py    its sentence-transformers side: the student, its targets, the trainer
    teacher_pass.py     only the teacher pass: fill the embedding cache, train nothing
    stage_data.py       the rows each method's stage trains on, and the StageServices a method with teachers of
                        its own (DvBERT) builds its rows with

Trans-Encoder (``runtime.tenc``) and Ray Tune (``runtime.tune``) have packages of their own.
"""
