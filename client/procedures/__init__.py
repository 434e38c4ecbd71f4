"""Each method's local procedure: what a client does with a train or evaluate message."""
