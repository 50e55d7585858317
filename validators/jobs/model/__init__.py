"""The model level: a transformers hybrid model whose recurrent mixers decode through the kernel under
test, judged by the next-token distribution under teacher forcing (docs/model.md).

``hf.py`` builds the model (a tiny random config of a registered architecture, or a local checkpoint
directory) and holds the architecture table; ``gdn.py`` the Gated DeltaNet mixer adapter (the layer's
own projections, conv and output norm around the recurrence, which is the fp64 reference for the
teacher and the kernel for the student); ``forcing.py`` the teacher-forced run and its metrics;
``report.py`` the JSON / MD report and the records.
"""
