//! The README and `docs/`: every relative link leads to a file that exists, every `#anchor` into a markdown file to
//! one of its headings (as GitHub names them), and the README stays short enough for a newcomer to read through.
//! The catalogues are made from their declarations: `docs/refusals.md` from the refusals'
//! ([`dpfusion::refusal::Refusal::catalogue`]), and the table of `SET dp.…` options in `docs/queries.md` from the
//! options' ([`dpfusion::session::OPTIONS`]); `DPFUSION_BLESS=1 cargo test --test main docs` rewrites them.

use crate::support::{ROOT, TempDir};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The most lines the README may have: it is the entry point, and details belong in `docs/`.
const README_MAX_LINES: usize = 160;

/// README.md and every `docs/*.md`, in a stable order.
fn doc_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ is readable")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The lines of `text` outside fenced code blocks (```), where markdown links and headings are real.
fn outside_fences(text: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push(line);
        }
    }
    out
}

/// The targets of the links and images (`[text](target)`, `![alt](target)`) of `text`, outside code blocks and
/// inline code spans.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in outside_fences(text) {
        // Even segments between backticks are prose; odd ones are code spans.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.trim_start_matches('<').trim_end_matches('>').to_string());
            rest = &after[end..];
        }
    }
    targets
}

/// The anchor GitHub gives a heading: lower case, every character but letters, digits, `_`, `-` and spaces
/// dropped, spaces turned into `-`.
fn slug(heading: &str) -> String {
    let mut out = String::new();
    for c in heading.trim().chars() {
        match c {
            ' ' => out.push('-'),
            '-' | '_' => out.push(c),
            c if c.is_alphanumeric() => out.extend(c.to_lowercase()),
            _ => {}
        }
    }
    out
}

/// The anchors of a markdown file's ATX headings (`# ...` to `###### ...`), a repeated one numbered `-1`, `-2`, ...
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for line in outside_fences(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim_end_matches('#'));
        let n = seen.entry(base.clone()).or_default();
        out.push(if *n == 0 { base } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// Every relative link of the markdown file `file` that leads nowhere, each with what is wrong.
fn broken_links(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).expect("a readable markdown file");
    let dir = file.parent().expect("a file has a directory");
    let mut broken = Vec::new();
    for target in link_targets(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = target.split_once('#').map_or((target.as_str(), None), |(p, a)| (p, Some(a)));
        let linked = if path.is_empty() { file.to_path_buf() } else { dir.join(path) };
        if !linked.exists() {
            broken.push(format!("{}: `{target}`: no file {}", file.display(), linked.display()));
            continue;
        }
        let Some(anchor) = anchor.filter(|_| linked.extension().is_some_and(|x| x == "md")) else { continue };
        let headings = anchors(&std::fs::read_to_string(&linked).expect("a readable markdown file"));
        if !headings.iter().any(|h| h == anchor) {
            broken.push(format!(
                "{}: `{target}`: no heading `#{anchor}` (it has: {})",
                file.display(),
                headings.join(", ")
            ));
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_readme_and_docs_leads_to_a_file_and_heading() {
    let files = doc_files(Path::new(ROOT));
    assert!(files.len() > 1, "docs/ holds the README's pages");
    let broken: Vec<String> = files.iter().map(PathBuf::as_path).flat_map(broken_links).collect();
    assert!(broken.is_empty(), "broken links (fix the target or the heading):\n{}", broken.join("\n"));
}

#[test]
fn the_readme_stays_short() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README.md");
    let lines = text.lines().count();
    assert!(
        lines < README_MAX_LINES,
        "README.md has {lines} lines; keep it under {README_MAX_LINES}: move details into docs/"
    );
}

#[test]
fn the_link_check_finds_a_missing_file_and_a_missing_heading_but_not_code() {
    let dir = TempDir::new("docs-links");
    std::fs::write(dir.join("b.md"), "# B\n\n## Real heading: `x`, (ε, δ)\n\n## Real heading: `x`, (ε, δ)\n").unwrap();
    let a = "# A\n[ok](b.md#real-heading-x-ε-δ) [again](b.md#real-heading-x-ε-δ-1) [self](#a) [web](https://x.org/n)\n\
             [gone](missing.md) ![gone too](img/none.svg) [no such heading](b.md#nope)\n\
             `[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n";
    std::fs::write(dir.join("a.md"), a).unwrap();
    let broken = broken_links(&dir.join("a.md"));
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(broken[0].contains("missing.md") && broken[1].contains("none.svg") && broken[2].contains("#nope"));
}

/// Set (to anything) to rewrite the generated docs rather than compare them.
const BLESS: &str = "DPFUSION_BLESS";

/// The command that rewrites the generated docs, for failure messages.
const REGENERATE: &str = "DPFUSION_BLESS=1 cargo test --test main docs";

/// Compares `file` (relative to the root) with what it should hold, or writes it under [`BLESS`].
fn check_generated(file: &str, expected: &str) {
    let path = Path::new(ROOT).join(file);
    if std::env::var_os(BLESS).is_some() {
        std::fs::write(&path, expected).expect("the generated file is writable");
        return;
    }
    let found = std::fs::read_to_string(&path).unwrap_or_default();
    if found != expected {
        let line = found.lines().zip(expected.lines()).position(|(a, b)| a != b);
        let at = line.map_or_else(|| "its length".to_string(), |n| format!("line {}", n + 1));
        panic!("{file} is not what its declaration generates (first difference: {at}); regenerate it: {REGENERATE}");
    }
}

/// Text for a markdown table cell: `|` escaped.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// Text as an inline code span, exactly as a program prints it (backticks inside are kept).
fn code_span(text: &str) -> String {
    assert!(!text.contains("``"), "a catalogue text with `` cannot be a code span: {text}");
    format!("`` {text} ``")
}

/// `docs/refusals.md`, from [`Refusal::catalogue`](dpfusion::refusal::Refusal::catalogue).
fn refusals_md() -> String {
    let all = dpfusion::refusal::Refusal::catalogue();
    let mut out = String::from(
        "# Refusals: every code, its SQLSTATE, and what to change\n\n\
         <!-- Generated from the declaration of the refusals (`refusals!` in crates/engine/src/refusal.rs) by \
         tests/docs.rs; do not edit. Regenerate: DPFUSION_BLESS=1 cargo test --test main docs -->\n\n\
         A refused statement spends nothing, and the refusal depends only on the statement, the policy and the \
         session, never on the data. Each refusal has a stable `code`, which programs match (`\"code\"` in JSON, \
         `code` of the Python exception, the REPL's `--format json`), a SQLSTATE, which a PostgreSQL client receives \
         from `dpfusion serve` ([serving.md](serving.md#refusals-and-sqlstates)), a message, and a hint: what to \
         change. Below, `{name}` stands for what the message or hint quotes there: a name or a part of the query, \
         a limit, a setting; never a value of the data. Errors that are not refusals of the statement (over the \
         budget, a configuration or ledger error) have codes of their own, such as `over_budget`.\n\n\
         | code | SQLSTATE | what it means |\n|---|---|---|\n",
    );
    for e in &all {
        out.push_str(&format!("| [`{0}`](#{0}) | {1} | {2} |\n", e.code, e.sqlstate.code, cell(&e.meaning)));
    }
    let mut group = "";
    for e in &all {
        if e.group != group {
            group = e.group;
            out.push_str(&format!("\n## {group}\n"));
        }
        out.push_str(&format!("\n### `{}`\n\n{}\n\n", e.code, e.meaning));
        out.push_str(&format!("- SQLSTATE {} ({})\n", e.sqlstate.code, e.sqlstate.condition));
        out.push_str(&format!("- Message: {}\n", code_span(e.message)));
        out.push_str(&format!("- Hint: {}\n", code_span(&e.hint)));
        for (when, hint) in &e.other_hints {
            out.push_str(&format!("- Hint when {when}: {}\n", code_span(hint)));
        }
    }
    out
}

/// The first line of the generated table of options in `docs/queries.md`.
const OPTIONS_BEGIN: &str = "<!-- The options below are generated from their declaration (`dp_options_table!` in \
                             crates/engine/src/session/statement.rs) by tests/docs.rs; do not edit. Regenerate: \
                             DPFUSION_BLESS=1 cargo test --test main docs -->";
/// The line after it.
const OPTIONS_END: &str = "<!-- End of the generated options. -->";

/// The table of `SET dp.…` options, from [`OPTIONS`](dpfusion::session::OPTIONS), between its two markers.
fn options_table() -> String {
    let mut out = format!(
        "{OPTIONS_BEGIN}\n\n| option | what it changes | until set | a value it refuses gets the hint |\n|---|---|---|---|\n"
    );
    for o in dpfusion::session::OPTIONS {
        let what = format!("{}. {}", o.help, o.doc);
        out.push_str(&format!(
            "| `SET dp.{} = {}` | {} | {} | {} |\n",
            o.name,
            o.example,
            cell(&what),
            cell(o.default),
            cell(o.hint)
        ));
    }
    out.push('\n');
    out.push_str(OPTIONS_END);
    out
}

#[test]
fn refusals_md_is_what_the_declaration_of_the_refusals_generates() {
    check_generated("docs/refusals.md", &refusals_md());
}

#[test]
fn the_options_in_queries_md_are_what_their_declaration_generates() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("docs/queries.md")).expect("docs/queries.md");
    let (Some(begin), Some(end)) = (text.find(OPTIONS_BEGIN), text.find(OPTIONS_END)) else {
        panic!("docs/queries.md has lost the markers of its table of options ({OPTIONS_BEGIN} ... {OPTIONS_END})");
    };
    let expected = format!("{}{}{}", &text[..begin], options_table(), &text[end + OPTIONS_END.len()..]);
    check_generated("docs/queries.md", &expected);
}

/// PostgreSQL's SQLSTATE classes (the first two characters; the PostgreSQL manual's appendix A).
const SQLSTATE_CLASSES: &[&str] = &[
    "00", "01", "02", "03", "08", "09", "0A", "0B", "0F", "0L", "0P", "0Z", "20", "21", "22", "23", "24", "25", "26",
    "27", "28", "2B", "2D", "2F", "34", "38", "39", "3B", "3D", "3F", "40", "42", "44", "53", "54", "55", "57", "58",
    "72", "F0", "HV", "P0", "XX",
];

#[test]
fn every_refusal_code_is_unique_and_snake_case_and_every_sqlstate_of_a_known_class() {
    let all = dpfusion::refusal::Refusal::catalogue();
    let mut seen = std::collections::HashSet::new();
    for e in &all {
        assert!(seen.insert(e.code), "the code `{}` is declared twice", e.code);
        let snake = e.code.split('_').all(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase()));
        assert!(snake, "{}: `{}` is not a snake_case identifier", e.variant, e.code);
        let state = e.sqlstate.code;
        assert!(
            state.len() == 5
                && state.chars().all(|c| c.is_ascii_digit() || c.is_ascii_uppercase())
                && SQLSTATE_CLASSES.contains(&&state[..2]),
            "{}: SQLSTATE {state} is not five characters of a known class",
            e.code
        );
        assert!(!e.meaning.is_empty() && !e.hint.is_empty(), "{}: no meaning or no hint", e.code);
    }
    assert!(all.len() >= 80, "{} refusals: the catalogue lost some", all.len());
}

/// The engine's source files (paths under `crates/engine/src`, `/`-separated) that `text` does not name as a code
/// span (`` `plan/size.rs` ``).
fn unnamed_sources(src: &Path, text: &str) -> Vec<String> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("a readable source directory") {
            let path = entry.expect("a source entry").path();
            if path.is_dir() {
                walk(&path, base, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let relative = path.strip_prefix(base).expect("under the base").to_string_lossy().replace('\\', "/");
                out.push(relative);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, src, &mut files);
    files.sort();
    files.retain(|f| !text.contains(&format!("`{f}`")));
    files
}

/// docs/architecture.md names every source file of the engine (its module map), so that a new module cannot be
/// added without saying where it stands in the flow of data.
#[test]
fn architecture_md_names_every_engine_source_file() {
    let root = Path::new(ROOT);
    let text = std::fs::read_to_string(root.join("docs/architecture.md")).expect("docs/architecture.md");
    let missing = unnamed_sources(&root.join("crates/engine/src"), &text);
    assert!(
        missing.is_empty(),
        "docs/architecture.md does not name these engine files (add them to its module map): {missing:?}"
    );
}

/// The check sees a file the text leaves out, and not one it names.
#[test]
fn the_module_map_check_finds_an_unnamed_file() {
    let dir = TempDir::new("module-map");
    std::fs::create_dir_all(dir.join("plan")).unwrap();
    for f in ["lib.rs", "plan/new.rs"] {
        std::fs::write(dir.join(f), "").unwrap();
    }
    assert_eq!(unnamed_sources(dir.as_ref(), "| `lib.rs` | `plan/new` |"), ["plan/new.rs"]);
    assert!(unnamed_sources(dir.as_ref(), "`lib.rs`, `plan/new.rs`").is_empty());
}
