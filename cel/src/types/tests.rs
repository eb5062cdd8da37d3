use super::*;
use crate::compile;

fn errors(source: &str) -> Vec<String> {
    type_errors(&compile(source).expect("parses"))
}

#[test]
fn literals_of_one_type_pass_and_mixed_ones_are_named() {
    for fine in [
        "[1, 2, 3].sum() == 6",
        "[[1], [2, 3]] == [[1], [2, 3]]",
        "[object.a, object.b] == []",
        "{'a': 1, 'b': 2}.size() == 2",
        "[[], [1]].size() == 2",
        "[oldObject, object].size() == 2",
        "object.spec.containers.all(c, c.name in ['a', 'b'])",
        "[1, 'a'.size()].sum() == 2",
        "'%d %s'.format([1, 'a']) == '1 a' && ['a'].all(s, '%s%d'.format([s, [1, 'b'].size()]) != '')",
    ] {
        assert_eq!(errors(fine), Vec::<String>::new(), "{fine}");
    }
    assert_eq!(
        errors("[1, 'a'].size() == 2"),
        ["a list literal mixes int and string"]
    );
    // The objects are `dyn` to the API server, and `dyn` is a type of its own in a literal.
    for mixed in [
        "[object.a, 1, object.b] == []",
        "[object.a, null].size() == 2",
        "['a', object.metadata.name].size() == 2",
        "[true ? 1 : dyn(2), 3].size() == 2",
        "object.spec.containers.all(c, [c.name, 'x'].size() == 2)",
    ] {
        assert_eq!(errors(mixed).len(), 1, "{mixed}");
    }
    assert_eq!(
        errors("sets.contains([1], [1.0, 1])"),
        ["a list literal mixes double and int"]
    );
    assert_eq!(
        errors("[[1.0], [2, 3]] == []"),
        ["a list literal mixes list(double) and list(int)"]
    );
    assert_eq!(
        errors("{'a': 1, 'b': 'x'}.size() == 2"),
        ["a map value literal mixes int and string"]
    );
    assert_eq!(
        errors("[1u, 2].size() == 2"),
        ["a list literal mixes uint and int"]
    );
    assert_eq!(
        errors("[1, null].size() == 2"),
        ["a list literal mixes int and null_type"]
    );
    // A computed element has its computed type.
    assert_eq!(
        errors("[1, 'a' + 'b'].size() == 2"),
        ["a list literal mixes int and string"]
    );
}

#[test]
fn calls_no_overload_takes_are_refused() {
    for (source, error) in [
        (
            "['a', 'b'].sum() == 'c'",
            "found no matching overload for 'sum' applied to 'list(string).()'",
        ),
        (
            "[[1], [2]].min() == [1]",
            "found no matching overload for 'min' applied to 'list(list(int)).()'",
        ),
        (
            "isSemver([1, 2, 3])",
            "found no matching overload for 'isSemver' applied to '(list(int))'",
        ),
        (
            "'a' && object.x",
            "found no matching overload for '_&&_' applied to '(string, dyn)'",
        ),
        (
            "1 + 'a' == 2",
            "found no matching overload for '_+_' applied to '(int, string)'",
        ),
        (
            "object.items.all(x, 1)",
            "found no matching overload for '_&&_' applied to '(bool, int)'",
        ),
        (
            "[1, 2].transformList(i, v, v % 2 == 0 ? [v] : v) == []",
            "found no matching overload for '_?_:_' applied to '(bool, list(int), int)'",
        ),
        (
            "{}.transformMapEntry(k, v, 'no', {k: v}) == {}",
            "found no matching overload for '_?_:_' applied to '(string, map(dyn, dyn), map(dyn, dyn))'",
        ),
        (
            "1 == 1.0",
            "found no matching overload for '_==_' applied to '(int, double)'",
        ),
        (
            "1 in [1.0]",
            "found no matching overload for '@in' applied to '(int, list(double))'",
        ),
        (
            "[1] < [2]",
            "found no matching overload for '_<_' applied to '(list(int), list(int))'",
        ),
        (
            "object.a + 1 == 'x'",
            "found no matching overload for '_==_' applied to '(int, string)'",
        ),
        ("1.foo == 1", "type 'int' does not support field selection"),
        // Every library's methods, with the types Kubernetes declares.
        (
            "object.metadata.name.startsWith(1)",
            "found no matching overload for 'startsWith' applied to 'dyn.(int)'",
        ),
        (
            "quantity('1').isLessThan(1)",
            "found no matching overload for 'isLessThan' applied to 'kubernetes.Quantity.(int)'",
        ),
        (
            "ip('1.2.3.4').family() == 'x'",
            "found no matching overload for '_==_' applied to '(int, string)'",
        ),
        (
            "semver('1.0.0').compareTo(quantity('1')) == 0",
            "found no matching overload for 'compareTo' applied to 'kubernetes.Semver.(kubernetes.Quantity)'",
        ),
        (
            "timestamp('2026-01-01T00:00:00Z').getFullYear(1) == 2026",
            "found no matching overload for 'getFullYear' applied to 'google.protobuf.Timestamp.(int)'",
        ),
        (
            "int(true) == 1",
            "found no matching overload for 'int' applied to '(bool)'",
        ),
        (
            "[1, 2][0u] == 1",
            "found no matching overload for '_[_]' applied to '(list(int), uint)'",
        ),
        (
            "authorizer.group(1).resource('pods').check('get').allowed()",
            "found no matching overload for 'group' applied to 'kubernetes.authorization.Authorizer.(int)'",
        ),
        // `request` has the fields Kubernetes declares, with their types.
        ("request.uid == ''", "undefined field 'uid'"),
        (
            "request.userInfo.groups.exists(g, g == 1)",
            "found no matching overload for '_==_' applied to '(string, int)'",
        ),
        // What a macro accumulates has the type of its step.
        (
            "[1].map(x, 'a') == [1]",
            "found no matching overload for '_==_' applied to '(list(string), list(int))'",
        ),
        (
            "{'a': 1}.?a.orValue('') == 1",
            "found no matching overload for 'orValue' applied to 'optional_type(int).(string)'",
        ),
        ("true ? [] : [1]", "must evaluate to bool but got list(int)"),
    ] {
        assert_eq!(errors(source), [error], "{source}");
    }
}

#[test]
fn what_is_not_known_is_not_refused() {
    for fine in [
        "object.spec.replicas + 1 > 2",
        "object.metadata.name + '-x' == 'a-x'",
        "object.items.sum() > 0 && object.items.min() >= 0",
        "[object.a, object.b].max() == object.a",
        "dyn([1, 2]).sum() == 3",
        "[].sum() == 0",
        "1 < 1.5 && 2u > 1 && 1.0 <= 1",
        "timestamp('2026-01-01T00:00:00Z') + duration('1h') > timestamp('2026-01-01T00:00:00Z')",
        "[1, 2].all(i, v, v > i) && {'a': 1}.exists(k, v, k == 'a' && v == 1)",
        "{'a': 1}.transformMap(k, v, v + 1) == {'a': 2}",
        "['a'].transformMapEntry(i, v, {v: i}) == {'a': 0}",
        "optional.of(1).value() + 1 == 2 && optional.none().hasValue() == false",
        "format.dns1123Label().validate('x').hasValue() == false",
        "semver('1.0.0').isLessThan(semver('2.0.0')) && quantity('1').isLessThan(quantity('2'))",
        "size(object.x) == 1 && object.x.size() == 1 && 'abc'.size() == 3",
        "type(1) == int && string(1) == '1'",
        "(true ? null : object.a) == null && object.a == null && null == null",
        "[1, 2][0] + 1 == 2 && {'a': 'b'}['a'] + 'c' == 'bc' && {'a': 'b'}.a + 'c' == 'bc'",
        "'a' in ['a'] && 'a' in {'a': 1} && object.a in [1.0]",
        "{}.a == 1 && optional.none() == optional.of(1) && true < false",
        "request.operation == 'CREATE' && request.userInfo.extra.all(k, v, v.size() > 0) && request.options.x == 1",
        // What an optional of a `dyn` holds is `dyn`.
        "object.?metadata.name.orValue(1) == 'probe'",
        "authorizer.path('/healthz').check('get').allowed() && authorizer.group('').resource('pods').check('create').reason() == ''",
        "[1, 2].first().orValue(0) == 1 && [optional.of(1)].unwrapOpt() == [1]",
    ] {
        assert_eq!(errors(fine), Vec::<String>::new(), "{fine}");
    }
}
