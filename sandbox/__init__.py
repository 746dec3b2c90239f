"""Sandbox providers: fake payments and mail services with fault injection.

Each provider runs as its own process (``python -m sandbox.payments`` /
``python -m sandbox.mail``) and never imports Django: the product talks to them only over
the network, exactly as it would to the real services, so a crash in a sandbox is a crash of a
foreign system and nothing in the product's process.
"""
