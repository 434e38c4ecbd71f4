"""Framework-free building blocks of headway: no Flower import lives here."""
