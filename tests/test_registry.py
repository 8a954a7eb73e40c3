"""The registry: register / get / list_registered / unregister, for every role."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from specdec.errors import RegistryConflictError, SpecDecError, UnknownNameError
from specdec.registry import ROLES, RegistryOverrideWarning, get, list_registered, register, unregister

PREFIX = "zz-test-registry-"


@pytest.fixture
def cleanup():
    """Names registered by a test are removed afterwards, whatever happens."""
    added: list[tuple[str, str]] = []
    yield added
    for role, name in added:
        if name in list_registered(role):
            unregister(role, name)


def reg(cleanup, role, name, obj=None, **kw):
    obj = obj if obj is not None else type(name.replace("-", "_"), (), {"__doc__": f"{role} {name}"})
    register(role, name, **kw)(obj)
    cleanup.append((role, name))
    return obj


def test_roles():
    assert ROLES == ("tree", "verifier", "draft", "target", "method")
    for role in ROLES:
        assert isinstance(list_registered(role), list)


def test_builtins_are_registered():
    assert "callable" in list_registered("draft") and "callable" in list_registered("target")
    assert get("target", "callable") is specdec.models.CallableLM


def test_register_get_and_name_attribute(cleanup):
    for role in ROLES:
        obj = reg(cleanup, role, PREFIX + role)
        assert get(role, PREFIX + role) is obj
        assert obj.registry_name == PREFIX + role
        assert PREFIX + role in list_registered(role)
        # roles are separate namespaces
        for other in ROLES:
            if other != role:
                assert PREFIX + role not in list_registered(other)


def test_objects_without_attributes_can_be_registered(cleanup):
    value = (1, 2)  # a tuple refuses new attributes
    assert register("method", PREFIX + "tuple")(value) is value
    cleanup.append(("method", PREFIX + "tuple"))
    assert get("method", PREFIX + "tuple") == (1, 2)


def test_list_is_sorted_and_filtered_by_glob(cleanup):
    for name in ("b-two", "a-one", "a-three", "c"):
        reg(cleanup, "verifier", PREFIX + name)
    assert list_registered("verifier", PREFIX + "a-*") == [PREFIX + "a-one", PREFIX + "a-three"]
    assert list_registered("verifier", PREFIX + "?") == [PREFIX + "c"]
    assert list_registered("verifier", PREFIX + "[bc]*") == [PREFIX + "b-two", PREFIX + "c"]
    assert list_registered("verifier", PREFIX.upper() + "*") == []  # case-sensitive
    everything = list_registered("verifier")
    assert everything == sorted(everything)
    assert list_registered("verifier", "*") == everything


@settings(deadline=None, max_examples=50)
@given(st.text(alphabet="abc*?-[]!", max_size=6))
def test_glob_filter_is_a_subset_of_all_names(pattern):
    names = list_registered("verifier", pattern)
    assert set(names) <= set(list_registered("verifier"))


def test_unknown_name_lists_choices_and_suggests(cleanup):
    reg(cleanup, "tree", PREFIX + "static")
    reg(cleanup, "tree", PREFIX + "sequoia")
    with pytest.raises(UnknownNameError) as exc:
        get("tree", PREFIX + "statc")
    message = str(exc.value)
    assert f"Did you mean {PREFIX + 'static'!r}" in message
    assert PREFIX + "sequoia" in message and PREFIX + "static" in message
    assert message.startswith("unknown tree")
    # a subclass of KeyError and of the library's base error, with a readable str()
    assert isinstance(exc.value, KeyError) and isinstance(exc.value, SpecDecError)
    assert not message.startswith("'")


def test_unknown_name_without_close_match_has_no_suggestion():
    with pytest.raises(UnknownNameError) as exc:
        get("verifier", "qqqqqqqqqqqqqqqqqqqq")
    assert "Did you mean" not in str(exc.value)
    for name in list_registered("verifier"):
        assert name in str(exc.value)


def test_unknown_role_lists_roles():
    for call in (lambda: get("verifiers", "x"), lambda: list_registered("nope"),
                 lambda: register("trees", "x"), lambda: unregister("nope", "x")):
        with pytest.raises(UnknownNameError) as exc:
            call()
        assert "roles are: tree, verifier, draft, target, method" in str(exc.value)


def test_reregister_conflict_unless_override(cleanup):
    first = reg(cleanup, "draft", PREFIX + "d")
    second = type("Second", (), {})
    with pytest.raises(RegistryConflictError, match="already registered.*override=True"):
        register("draft", PREFIX + "d")(second)
    assert get("draft", PREFIX + "d") is first  # unchanged by the failed attempt
    register("draft", PREFIX + "d", override=True)(second)
    assert get("draft", PREFIX + "d") is second


def test_registering_the_same_object_twice_is_idempotent(cleanup):
    obj = reg(cleanup, "draft", PREFIX + "same")
    register("draft", PREFIX + "same")(obj)
    assert get("draft", PREFIX + "same") is obj


@pytest.mark.parametrize("bad", ["", None, 3])
def test_bad_names(bad):
    with pytest.raises(ValueError):
        register("verifier", bad)


def test_unregister(cleanup):
    reg(cleanup, "method", PREFIX + "gone")
    unregister("method", PREFIX + "gone")
    assert PREFIX + "gone" not in list_registered("method")
    with pytest.raises(UnknownNameError):
        get("method", PREFIX + "gone")
    with pytest.raises(UnknownNameError):
        unregister("method", PREFIX + "gone")


def test_public_api_reexports():
    assert specdec.register is register and specdec.get is get and specdec.list_registered is list_registered


# ------------------------------------------------------------------ origins (issue 43: plug-ins)
def test_origin_is_the_registering_module(cleanup):
    from specdec.registry import origin

    assert origin("verifier", "rejection-iid") == "specdec.verify.rejection"
    assert origin("target", "callable") == origin("draft", "callable") == "specdec.models.callable"
    # register_method registers on its caller's behalf: the builder module that calls it is the origin
    assert origin("method", "sd") == "specdec.trees.chain" and origin("method", "rheo") == "specdec.trees.rheo"
    reg(cleanup, "tree", PREFIX + "here")
    assert origin("tree", PREFIX + "here") == __name__
    with pytest.raises(UnknownNameError, match="unknown tree"):
        origin("tree", PREFIX + "nowhere")


def test_origin_follows_override_and_unregister(cleanup):
    from specdec.registry import origin

    reg(cleanup, "draft", PREFIX + "o")
    namespace = {"__name__": "zz_other_module", "register": register}
    with pytest.warns(RegistryOverrideWarning, match=f"module 'zz_other_module' replaces draft '{PREFIX}o'"):
        exec("register('draft', %r, override=True)(type('D', (), {}))" % (PREFIX + "o"), namespace)
    assert origin("draft", PREFIX + "o") == "zz_other_module"
    unregister("draft", PREFIX + "o")
    with pytest.raises(UnknownNameError):
        origin("draft", PREFIX + "o")


def test_conflict_names_the_owner_and_the_claimant(cleanup):
    reg(cleanup, "verifier", PREFIX + "taken")
    namespace = {"__name__": "zz_claimant", "register": register}
    with pytest.raises(RegistryConflictError) as exc:
        exec("register('verifier', %r)(type('V', (), {}))" % (PREFIX + "taken"), namespace)
    err = exc.value
    assert (err.role, err.name, err.owner, err.claimant) == ("verifier", PREFIX + "taken", __name__, "zz_claimant")
    assert f"already registered by module {__name__!r}" in str(err) and "module 'zz_claimant' cannot" in str(err)
