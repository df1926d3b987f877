"""The commands of `nmt`, one module per kind of work (nmt.cli.main runs them): stages (preprocess, train),
decoding (translate, score, serve), reports (evaluate, plot), models (average, export, info)."""
