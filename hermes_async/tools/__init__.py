"""Tools the model calls: registry, toolsets, terminal/process/file/web/todo/browser, sandboxes."""

__all__ = ()
