"""`python manage.py tools_import openapi <file-or-URL> --prefix NAME`: one tool per operation;
`python manage.py tools_import mcp <URL> | --command "…" --prefix NAME`: one tool per tool of an
MCP server.

Tools are created **disabled** (an administrator reads them first) unless `--enable`, which also
allows them for every agent of the tenant (`--tenant`, default the only one). Importing again
updates the tools from the document (a changed request shape bumps their schema version) and
leaves whether they are enabled alone. See docs/tools.md, approvals/openapi.py and
approvals/mcp_import.py.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from approvals.mcp_import import McpImportError, list_server_tools, mcp_client, tools_from_listing
from approvals.models import Tool
from approvals.openapi import OpenApiError, base_url, load, tools_from_document
from approvals.tools import REFERENCE_NAME, credential, tool_save, tools_enable
from console.lib.errors import InvalidInput
from console.models import RiskTier, Tenant


class Command(BaseCommand):
    help = ("Create (or update) tools from an API description: tools_import openapi <file-or-URL> --prefix NAME, "
            "or from an MCP server: tools_import mcp <URL> | --command '…' --prefix NAME.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("format", choices=["openapi", "mcp"], help="What the source describes.")
        parser.add_argument("source", nargs="?",
                            help="openapi: a file path or an http(s) URL; mcp: the server's streamable HTTP URL.")
        parser.add_argument("--command", help="mcp: the command line of a server speaking stdio.")
        parser.add_argument("--credential-ref",
                            help="mcp: the name of the environment variable (or setting) holding the server's "
                                 "credential; read now to list the tools, and by the workers at each call.")
        parser.add_argument("--prefix", required=True, help="Tools are named <prefix>.<operationId>.")
        parser.add_argument("--tier", type=int, choices=[t.value for t in RiskTier],
                            help="Base tier of every imported tool (default: L1 reads, L2 writes).")
        parser.add_argument("--base-url", help="The API's base URL (default: the document's first server).")
        parser.add_argument("--timeout", type=float, default=10.0, help="Each call's timeout in seconds.")
        parser.add_argument("--enable", action="store_true",
                            help="Enable the tools and allow them for every agent of the tenant.")
        parser.add_argument("--tenant", help="The tenant's slug for --enable (default: the only tenant).")

    def handle(self, *args, **options) -> None:
        prefix = options["prefix"]
        if not prefix.replace("_", "").replace("-", "").replace(".", "").isalnum():
            raise CommandError("--prefix: letters, digits, '.', '_' and '-' only.")
        tenant = self._tenant(options["tenant"]) if options["enable"] else None
        if options["format"] == "mcp":
            imported = self._from_mcp(options, prefix)
            source = options["source"] or options["command"]
        else:
            if not options["source"] or options["command"]:
                raise CommandError("openapi: name the document (a file path or URL), and no --command.")
            source = options["source"]
            text, document_url = self._read(source)
            try:
                document = load(text)
                base = base_url(document, document_url=document_url, override=options["base_url"])
                imported = tools_from_document(document, prefix=prefix, base=base, tier=options["tier"],
                                               timeout=options["timeout"])
            except OpenApiError as exc:
                raise CommandError(str(exc)) from exc
        saved: list[Tool] = []
        with transaction.atomic():
            for spec in imported.tools:
                tool = Tool.objects.filter(name=spec["name"]).first() or Tool(name=spec["name"], enabled=False)
                created = tool.pk is None
                for name, value in spec.items():
                    setattr(tool, name, value)
                try:
                    tool_save(tool=tool)
                except InvalidInput as exc:
                    raise CommandError(f"{spec['name']}: {exc} {exc.details}") from exc
                saved.append(tool)
                target = f"{tool.http_method} {tool.http_url}" if tool.http_url else f"MCP tool {tool.mcp_tool}"
                self.stdout.write(f"{'created' if created else 'updated'} {tool.name} ({tool.kind}, L{tool.base_tier}, "
                                  f"{tool.idempotency} idempotency, {target}, schema v{tool.schema_version})")
            if tenant is not None and saved:
                agents = tools_enable(tools=saved, tenant=tenant)
                self.stdout.write(f"enabled {len(saved)} tools for {len(agents)} agents of {tenant.slug}")
        for operation, why in imported.skipped:
            self.stderr.write(f"skipped {operation}: {why}")
        state = "enabled" if tenant is not None else "disabled until an administrator enables them"
        self.stdout.write(f"{len(saved)} tools from {source} ({state})")

    def _from_mcp(self, options: dict, prefix: str):
        server = options["source"] or options["command"]
        if bool(options["source"]) == bool(options["command"]):
            raise CommandError("mcp: name the server's URL or its --command, one of the two.")
        if options["source"] and not options["source"].startswith(("http://", "https://")):
            raise CommandError("mcp: the server's URL is http(s); a local server is started with --command.")
        ref = options["credential_ref"] or ""
        secret = None
        if ref:
            if not REFERENCE_NAME.fullmatch(ref):
                raise CommandError("--credential-ref: the name of an environment variable, never the secret.")
            secret = credential(ref)
            if secret is None:
                raise CommandError(f"--credential-ref: {ref} is not set here.")
        try:
            client = mcp_client(server, timeout=options["timeout"], credential_ref=ref, secret=secret)
            listed = list_server_tools(client, timeout=options["timeout"])
        except (McpImportError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        return tools_from_listing(listed, prefix=prefix, server=server, tier=options["tier"],
                                  timeout=options["timeout"], credential_ref=ref)

    def _tenant(self, slug: str | None) -> Tenant:
        if slug:
            tenant = Tenant.objects.filter(slug=slug).first()
            if tenant is None:
                raise CommandError(f"No tenant {slug!r}.")
            return tenant
        tenants = list(Tenant.objects.order_by("pk")[:2])
        if len(tenants) != 1:
            raise CommandError("--enable: name the tenant with --tenant (there is not exactly one).")
        return tenants[0]

    def _read(self, source: str) -> tuple[str, str | None]:
        if source.startswith(("http://", "https://")):
            try:
                response = httpx.get(source, timeout=30, follow_redirects=True)
                response.raise_for_status()
            except httpx.HTTPError as exc:
                raise CommandError(f"Cannot fetch {source}: {exc}") from exc
            return response.text, str(response.url)
        try:
            return Path(source).read_text(encoding="utf-8"), None
        except OSError as exc:
            raise CommandError(f"Cannot read {source}: {exc}") from exc
