"""Gate documents: Markdown whose claims are checked against the facts manifest
(``alma gates check``) and re-rendered from it (``alma gates render``). Format: docs/gates.md."""
