"""mail.send's schema holds what a mail header can carry: one plain address per entry, no
control or invisible characters, no line break in the subject. Refused at the gate, before
anything is dispatched (before: a CRLF subject went dispatched → unknown → 4 attempts → failed)."""

from __future__ import annotations

import pytest
from jsonschema import Draft202012Validator

from ledger.models import Operation
from tests.fixtures.api import MAIL, assert_error, call_body


def propose(api, running_task, **changes):
    arguments = {**MAIL, **changes}
    return api.post(f"/api/v1/tasks/{running_task.task_id}/calls",
                    call_body(running_task, tool="mail.send", arguments=arguments), format="json")


@pytest.mark.parametrize("address", [
    "ceo@acme.test\u202emoc.live@",  # a right-to-left override: reads as another address
    "bob@acme.test, evil@x.test",  # two recipients in one entry
    "bob@acme.test\u200b",  # a zero-width space
    "Bob <bob@acme.test>",  # a display name: the header would carry it
    "bob@acme.test\r\nBcc: evil@x.test",
    "bob@@acme.test", "bob", "@acme.test", "bob@", "bob@acme", "bob@-acme.test", "b ob@acme.test",
    "bob@ａcme.test",  # a fullwidth letter that IDNA would map to "a": not what is shown
])
def test_an_address_that_is_not_exactly_one_plain_mailbox_is_refused(api, running_task, address):
    response = propose(api, running_task, to=[address])
    error = assert_error(response, 400, "invalid")
    assert [(e["path"], e["validator"]) for e in error["details"]["errors"]] == [("to.0", "format")]
    assert "is not a 'email'" in error["details"]["errors"][0]["message"]
    assert not Operation.objects.exists()


@pytest.mark.parametrize("subject", ["Hello\r\nBcc: evil@x.test", "Hello\nthere", "Hello\rthere",
                                     "Hi\u2028there", "Hello\n", "Hello\r\n", "\tHello"])
def test_a_subject_with_a_line_break_or_control_character_is_refused(api, running_task, subject):
    response = propose(api, running_task, subject=subject)
    error = assert_error(response, 400, "invalid")
    assert [(e["path"], e["validator"]) for e in error["details"]["errors"]] == [("subject", "not")]
    assert not Operation.objects.exists()


def test_a_subject_holding_u0000_is_refused_where_the_json_comes_in(api, running_task):
    response = propose(api, running_task, subject="Hi\x00")
    assert "U+0000" in assert_error(response, 400, "invalid")["message"]
    assert not Operation.objects.exists()


@pytest.mark.parametrize("address", ["bob@acme.test", "o'brien+tag@mail.acme.test", "bob@bücher.example",
                                     "bob@xn--bcher-kva.example", "BOB@ACME.TEST"])
def test_plain_addresses_and_international_domains_pass(api, running_task, address):
    response = propose(api, running_task, to=[address, "carol@acme.test"])
    assert response.status_code == 201, response.content
    assert response.json()["decision"]["outcome"] == "awaiting_approval"


def test_the_strict_check_is_the_one_the_gate_uses_for_every_schema_once_the_app_is_loaded():
    checker = Draft202012Validator.FORMAT_CHECKER
    assert not checker.conforms("bob@acme.test, evil@x.test", "email")
    assert not checker.conforms("ceo@acme.test\u202emoc.live@", "idn-email")
    assert checker.conforms(42, "email")  # the schema's "type" judges non-strings


def test_the_migration_gives_an_existing_seeded_tool_the_subject_rule(db):
    from importlib import import_module

    from django.apps import apps

    from approvals.defaults import MAIL_SCHEMA
    from approvals.models import Tool

    migration = import_module("approvals.migrations.0011_mail_send_strict_headers")
    old = {**MAIL_SCHEMA, "properties": {**MAIL_SCHEMA["properties"], "subject": migration.OLD_SUBJECT}}
    tool = Tool.objects.create(name="mail.send", adapter="mail.send", json_schema=old, base_tier=2)
    edited = Tool.objects.create(name="mail.other", adapter="mail.send", json_schema=old, base_tier=2)

    migration.forward(apps, None)

    tool.refresh_from_db()
    edited.refresh_from_db()
    assert tool.json_schema == MAIL_SCHEMA
    assert edited.json_schema == old
