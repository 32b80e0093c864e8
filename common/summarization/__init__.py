"""Private distributed data summarization (Sarpatwar et al.): h1, h2/MWEM, MMD, bids,
PrivAuction, the candidates allocation, the binary-tree continual release and their calibration."""
