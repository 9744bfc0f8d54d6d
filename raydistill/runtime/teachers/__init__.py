"""Frozen teachers and the data they feed: teacher encoders and actors, the content-addressed embedding cache, and the
Ray Data pipeline that fills it.

    teacher.py          TeacherSpec, TeacherEncoder, the teacher's identity (a hash of its weights)
    cache_store.py      EmbeddingCache's store: part files, index, lookups, appends, TeacherVectors
    embedding_cache.py  the teacher pass that fills the cache with the misses (re-exports the store's names)
    rows_file.py        the rows file: written once per content, verified, memory-mapped
    pipeline.py         training texts and rows, the Ray Data teacher pass over cache misses
"""
