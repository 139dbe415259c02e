"""Subcommands of the `kafscale` command line: one module per command family.

Each module has `add_parser(commands)`, which adds its subparser(s) and sets `run` (args -> exit code)
as the parser default. To add a command family, write the module and list it in COMMAND_MODULES.
"""

from __future__ import annotations

COMMAND_MODULES = (
    "kafscale.commands.serve",
    "kafscale.commands.proxy",
    "kafscale.commands.topic",
    "kafscale.commands.produce",
    "kafscale.commands.consume",
    "kafscale.commands.cluster",
    "kafscale.commands.group",
    "kafscale.commands.user",
    "kafscale.commands.acl",
    "kafscale.commands.metadata",
    "kafscale.commands.pipeline",
    "kafscale.commands.sql",
    "kafscale.commands.bench",
)
