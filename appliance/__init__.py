"""The composition root: settings, wiring of engine and web, the serve and migrate commands."""
