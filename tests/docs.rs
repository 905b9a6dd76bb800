//! The README and `docs/`: every relative link leads to a file that exists, every `#anchor` into a markdown file to
//! one of its headings (as GitHub names them), and the README stays short enough for a newcomer to read through.

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
