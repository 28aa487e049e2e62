//! The hand-written parsers that take untrusted input (query strings, policies): for any
//! input they return a value or an error, never panic; and whatever they accept prints back
//! (`Display`) to text that parses to the same value. Inputs are drawn from each grammar's
//! own alphabet, so that a good share of them parse.

#![allow(clippy::unwrap_used)]

use orrery_api::fieldpath::FieldPath;
use orrery_api::{Quantity, fields, labels};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 2_000,
        // A failure prints its smallest input; nothing is written into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Label keys, values and operators, with the characters that break them.
fn label_text() -> impl Strategy<Value = String> {
    let atom = prop_oneof![
        "[a-z]{1,4}",
        "[a-z0-9.-]{1,6}/[a-z]{1,3}",
        Just("=".to_string()),
        Just("==".to_string()),
        Just("!=".to_string()),
        Just("!".to_string()),
        Just(",".to_string()),
        Just(" in ".to_string()),
        Just(" notin ".to_string()),
        Just("(".to_string()),
        Just(")".to_string()),
        Just(">".to_string()),
        Just("<".to_string()),
        Just(" ".to_string()),
        "[0-9]{1,3}",
        "[_.\\-/\\\\\"'é€]{1,2}",
    ];
    proptest::collection::vec(atom, 0..12).prop_map(|v| v.concat())
}

fn field_text() -> impl Strategy<Value = String> {
    let atom = prop_oneof![
        "metadata\\.(name|namespace)",
        "spec\\.[a-z]{1,5}",
        "[a-z]{1,4}",
        Just("=".to_string()),
        Just("==".to_string()),
        Just("!=".to_string()),
        Just(",".to_string()),
        Just("\\".to_string()),
        Just("\\,".to_string()),
        Just("\\=".to_string()),
        "[ _.\\-/!é]{1,2}",
    ];
    proptest::collection::vec(atom, 0..10).prop_map(|v| v.concat())
}

fn quantity_text() -> impl Strategy<Value = String> {
    (
        "[+-]?",
        "[0-9]{0,22}",
        prop_oneof![Just(String::new()), "\\.[0-9]{0,12}".prop_map(|s| s)],
        prop_oneof![
            Just(String::new()),
            "(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)".prop_map(|s| s),
            "[eE][+-]?[0-9]{1,3}".prop_map(|s| s),
            "[a-zA-Z ._]{1,2}".prop_map(|s| s),
        ],
    )
        .prop_map(|(s, i, f, x)| format!("{s}{i}{f}{x}"))
}

fn path_text() -> impl Strategy<Value = String> {
    let atom = prop_oneof![
        "[a-zA-Z]{1,5}",
        Just(".".to_string()),
        Just("[".to_string()),
        Just("]".to_string()),
        "\\[[0-9]{1,3}\\]",
        "\\[\"[a-z./ ]{0,6}\"\\]",
        Just("\"".to_string()),
        Just("\\".to_string()),
        "[0-9 _/\\-é]{1,2}",
    ];
    proptest::collection::vec(atom, 0..10).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn label_selectors_print_back_what_they_accept(s in label_text()) {
        if let Ok(sel) = labels::Selector::parse(&s) {
            let printed = sel.to_string();
            let again = labels::Selector::parse(&printed);
            prop_assert_eq!(again.as_ref(), Ok(&sel), "{:?} printed as {:?}", s, printed);
        }
    }

    #[test]
    fn field_selectors_print_back_what_they_accept(s in field_text()) {
        if let Ok(sel) = fields::Selector::parse(&s) {
            let printed = sel.to_string();
            let again = fields::Selector::parse(&printed);
            prop_assert_eq!(again.as_ref(), Ok(&sel), "{:?} printed as {:?}", s, printed);
        }
    }

    #[test]
    fn quantities_print_back_what_they_accept(s in quantity_text()) {
        if let Ok(q) = s.parse::<Quantity>() {
            let printed = q.to_string();
            let again = printed.parse::<Quantity>();
            prop_assert!(again.is_ok(), "{:?} printed as {:?}: {:?}", s, printed, again);
            prop_assert_eq!(again.unwrap(), q, "{:?} printed as {:?}", s, printed);
        }
    }

    #[test]
    fn field_paths_print_back_what_they_accept(s in path_text()) {
        if let Ok(p) = FieldPath::parse(&s) {
            let printed = p.to_string();
            let again = FieldPath::parse(&printed);
            prop_assert_eq!(again.as_ref(), Ok(&p), "{:?} printed as {:?}", s, printed);
        }
    }

    /// Any text at all: an answer, never a panic.
    #[test]
    fn no_text_makes_a_parser_panic(s in "\\PC{0,40}") {
        let _ = labels::Selector::parse(&s);
        let _ = fields::Selector::parse(&s);
        let _ = s.parse::<Quantity>();
        let _ = FieldPath::parse(&s);
    }
}
