"""The Flower ClientApp and each method's local procedure."""
