"""The plots of muonbed results, one module per plot kind over one shared loader:

  common      constants, record field access, labels, units, safe file names
  loader      the results folder: manifest, checksums, point identities, field validation
  sweep       what a sweep varies, point order, short labels
  style       figure style and the Plotter (footer, deterministic files)
  strategies, throughput, traffic, scaling, ranks, timeline, claims   the plot kinds

analysis/plot.py is the command line over them."""
