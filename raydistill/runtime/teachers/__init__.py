"""Frozen teachers and the data they feed: teacher encoders and actors, the content-addressed embedding cache, the
Ray Data pipeline that fills it, and the shared instance-queue actor.

    teacher.py          TeacherSpec, TeacherEncoder, the teacher's identity (a hash of its weights)
    embedding_cache.py  EmbeddingCache: memory-mapped teacher vectors keyed by sentence
    pipeline.py         training texts and rows, the Ray Data teacher pass over cache misses
    queue_actor.py      the instance queue shared by the learners (a Ray actor)
"""
