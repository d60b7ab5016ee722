"""inferd client."""
