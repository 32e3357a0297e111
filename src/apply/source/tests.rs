use serde_json::json;

use super::*;

fn values(text: &str) -> Vec<Value> {
    read(text.as_bytes(), 100).expect("readable").into_iter().map(|d| d.value).collect()
}

fn refused(text: &str) -> SourceError {
    read(text.as_bytes(), 100).expect_err("refused")
}

/// The classic billion laughs: ten levels of ten aliases each.
fn billion_laughs() -> String {
    let mut yaml = String::from(
        "a0: &a0 [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]\n",
    );
    for level in 1..10 {
        let refs = vec![format!("*a{}", level - 1); 10].join(", ");
        yaml.push_str(&format!("a{level}: &a{level} [{refs}]\n"));
    }
    yaml.push_str("kind: Pool\nname: bomb\nspec: *a9\n");
    yaml
}

#[test]
fn several_documents_and_top_level_lists_are_read_in_order_with_their_lines() {
    let text = "kind: Pool\nname: a\n---\n# a comment\nkind: Pool\nname: b\n---\n- kind: Engine\n  name: c\n- kind: Engine\n  name: d\n";
    let docs = read(text.as_bytes(), 100).expect("readable");
    let names: Vec<&str> = docs.iter().map(|d| d.value["name"].as_str().unwrap_or("?")).collect();
    assert_eq!(names, ["a", "b", "c", "d"]);
    assert_eq!(docs[0].line, 1);
    assert_eq!(docs[1].line, 5, "{docs:?}");
    assert_eq!((docs[3].item, docs[2].item), (Some(2), Some(1)), "items are counted from 1, as people count");
    assert_eq!(docs.iter().map(|d| d.number).collect::<Vec<_>>(), [1, 2, 3, 3]);
}

#[test]
fn empty_documents_count_in_the_numbering_a_person_sees() {
    let text = "kind: Pool\nname: a\n---\n# nothing but a comment\n---\nkind: Pool\nname: c\n";
    let docs = read(text.as_bytes(), 100).expect("readable");
    assert_eq!(docs.len(), 2, "the empty document holds no object");
    assert_eq!((docs[1].number, docs[1].line), (3, 6), "the file's third document, on line 6: {docs:?}");
}

#[test]
fn errors_speak_of_the_file_not_of_the_reader() {
    let duplicate = refused("kind: Pool\nname: a\nname: b\n");
    assert_eq!(
        duplicate.to_string(),
        "line 3 column 1: key \"name\" appears twice in one mapping; write each key once"
    );
    for deep in [
        format!("{}1{}", "[".repeat(40), "]".repeat(40)),
        (0..40).map(|i| format!("{}k{i}:\n", "  ".repeat(i))).collect(),
    ] {
        let e = refused(&deep);
        assert_eq!(e.problem, Problem::TooDeep, "{e}");
        assert!(e.at.is_some(), "where it got too deep: {e}");
        assert!(e.to_string().contains("more than 32 levels deep"), "{e}");
    }
    let message = too_large(None).to_string();
    assert_eq!(
        message,
        "the input exceeds the limit of 8388608 bytes (8 MiB) for one fleet file; split it into several files"
    );
    for text in [duplicate.to_string(), refused(&billion_laughs()).to_string(), message] {
        for internal in ["DuplicateKeyPolicy", "Options", "budget", "Depth {", "recursion"] {
            assert!(!text.contains(internal), "{text:?} shows the reader's internals ({internal})");
        }
    }
}

#[test]
fn json_is_read_as_yaml_and_empty_documents_are_skipped() {
    assert_eq!(values(r#"{"kind": "Pool", "name": "a", "spec": {"replicas": 2}}"#)[0]["spec"]["replicas"], json!(2));
    assert_eq!(values(r#"[{"kind": "Pool"}, {"kind": "Engine"}]"#).len(), 2);
    assert!(values("").is_empty());
    assert_eq!(values("---\n---\nkind: Pool\n").len(), 1);
}

#[test]
fn only_true_and_false_are_booleans_and_versions_stay_strings() {
    let v = &values("a: no\nb: true\nc: v1.29.2\nd: 3\ne: \"3\"\n")[0];
    assert_eq!(v, &json!({"a": "no", "b": true, "c": "v1.29.2", "d": 3, "e": "3"}));
}

#[test]
fn duplicate_keys_are_refused_with_their_line() {
    let e = refused("kind: Pool\nname: a\nname: b\n");
    assert_eq!(e.at.map(|(l, _)| l), Some(3), "{e}");
    assert!(e.problem == Problem::DuplicateKey { key: Some("name".into()) }, "{e}");
}

#[test]
fn broken_yaml_names_its_line() {
    let e = refused("kind: Pool\nspec:\n  replicas: [1, 2\n");
    assert!(e.at.is_some(), "{e}");
}

#[test]
fn a_billion_laughs_is_refused_at_once() {
    // Refused by the alias budget, that is before anything was expanded (a
    // time limit here would only measure the machine's load).
    let e = refused(&billion_laughs());
    assert_eq!(e.problem, Problem::AliasesTooLarge, "{e}");
}

#[test]
fn aliases_that_share_a_block_are_fine() {
    let mut text = String::from("- &labels {team: infra, tier: edge}\n");
    for i in 0..200 {
        text.push_str(&format!("- {{kind: Pool, name: p{i}, labels: *labels}}\n"));
    }
    assert_eq!(read(text.as_bytes(), 1000).expect("readable").len(), 201);
}

#[test]
fn deep_nesting_is_refused() {
    let deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
    refused(&deep);
    let mut block = String::new();
    for i in 0..200 {
        block.push_str(&format!("{}k{i}:\n", "  ".repeat(i)));
    }
    refused(&block);
}

#[test]
fn too_many_documents_and_too_large_text_are_refused() {
    let many = "kind: Pool\n---\n".repeat(101);
    assert_eq!(refused(&many).problem, Problem::TooManyDocuments(100));
    let list = format!("[{}]", vec!["{}"; 101].join(","));
    assert_eq!(refused(&list).problem, Problem::TooManyDocuments(100));
    let big = vec![b' '; MAX_FILE_BYTES as usize + 1];
    // Refused on its size, before parsing.
    let e = read(&big, 100).expect_err("too large");
    assert_eq!(e.problem, Problem::TooLarge { size: Some(MAX_FILE_BYTES + 1) }, "{e}");
}
