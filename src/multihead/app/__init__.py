"""The ``multihead`` application: the command line and what it runs (training, run directories, data, tokenizers,
translation and evaluation, plots, the benchmark).

It is built on the library (``multihead.torch``, ``multihead.keras``, ``multihead.io``, ...), which never imports
it. Its dependencies beyond the library's are the ``app`` extra.
"""
