"""``alma lint``: kas files against kas's own schema, pinned commits, oelint-adv, layer checks."""
