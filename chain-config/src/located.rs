//! The located value every front end reads. A TOML document (toml's spanned
//! tree) or a JSON document (jsonc-parser's AST, in strict JSON mode) is
//! converted once into [`Node`]s that keep the byte span of every key and
//! value, so that each error names its key path and its `line:column`
//! (columns in characters) without searching the text again. A key given
//! twice in one table or object is found here, from the tree, with the path
//! of both.

use std::ops::Range;

use jsonc_parser::ast;
use jsonc_parser::common::Ranged;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::error::{ConfigError, Location, schema_error};

/// Which syntax a document was written in: it decides the type words of
/// messages (`integer` / `number`, `table` / `object`) and where an error
/// about a key's value points (TOML: the value; JSON: the key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Toml,
    Json,
}

/// A parsed document: its text (for locations and values as written) and
/// its syntax.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Doc<'a> {
    pub(crate) text: &'a str,
    pub(crate) format: Format,
}

/// One value with its byte span in the document.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) value: Value,
    pub(crate) span: Range<usize>,
}

/// The value of a [`Node`].
#[derive(Debug, Clone)]
pub(crate) enum Value {
    /// JSON `null`.
    Null,
    Bool(bool),
    /// A TOML integer (any radix), or a JSON number written without
    /// fraction or exponent that fits an `i128`.
    Int(i128),
    /// A TOML float, or any other JSON number: the text to parse (TOML's
    /// float without `_`; JSON's literal).
    Float(String),
    Str(String),
    /// A TOML date or time.
    Datetime,
    Array(Vec<Node>),
    /// A TOML table or JSON object, in source order.
    Table(Vec<Entry>),
}

/// One key of a table with its span and value.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) key: String,
    pub(crate) key_span: Range<usize>,
    pub(crate) value: Node,
}

impl Node {
    /// The entries, when this is a table / object.
    pub(crate) fn entries(&self) -> Option<&[Entry]> {
        match &self.value {
            Value::Table(t) => Some(t),
            _ => None,
        }
    }

    /// The first entry called `key`, when this is a table / object.
    pub(crate) fn get(&self, key: &str) -> Option<&Entry> {
        self.entries()?.iter().find(|e| e.key == key)
    }

    /// The string, when this is one.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn is_null(&self) -> bool {
        matches!(self.value, Value::Null)
    }

    /// The value as an `f64` when it is a number (`None` otherwise, and for
    /// a float text that does not parse).
    pub(crate) fn as_f64(&self) -> Option<f64> {
        match &self.value {
            Value::Int(i) => Some(*i as f64),
            Value::Float(text) => parse_float_text(text),
            _ => None,
        }
    }

    /// The value as an `f32` when it is a number: `Ok(None)` when it is not
    /// one, `Err(())` when it is written finite but beyond `f32` (it would
    /// read as `±inf`; only TOML's `inf` is infinite on purpose).
    pub(crate) fn as_f32(&self) -> Result<Option<f32>, ()> {
        let (x, text): (f32, &str) = match &self.value {
            Value::Int(i) => (*i as f32, ""),
            Value::Float(text) => match text.parse::<f32>() {
                Ok(x) => (x, text),
                Err(_) => return Err(()),
            },
            _ => return Ok(None),
        };
        if x.is_infinite() && !text.contains("inf") {
            Err(())
        } else {
            Ok(Some(x))
        }
    }

    /// The type of the value in the document's own words.
    pub(crate) fn type_word(&self, format: Format) -> &'static str {
        match (&self.value, format) {
            (Value::Null, _) => "null",
            (Value::Bool(_), _) => "boolean",
            (Value::Int(_), Format::Toml) => "integer",
            (Value::Float(_), Format::Toml) => "float",
            (Value::Int(_) | Value::Float(_), Format::Json) => "number",
            (Value::Str(_), _) => "string",
            (Value::Datetime, _) => "datetime",
            (Value::Array(_), _) => "array",
            (Value::Table(_), Format::Toml) => "table",
            (Value::Table(_), Format::Json) => "object",
        }
    }
}

/// `f64` of a float text (TOML spells infinities `inf`, Rust `inf` too).
fn parse_float_text(text: &str) -> Option<f64> {
    text.parse::<f64>().ok()
}

/// Shorten a value for a message.
fn shorten(text: String, max: usize) -> String {
    if text.chars().count() > max {
        text.chars().take(max - 3).collect::<String>() + "..."
    } else {
        text
    }
}

impl Doc<'_> {
    /// `line:column` of a byte offset.
    pub(crate) fn loc(&self, span: &Range<usize>) -> Option<Location> {
        Some(Location::from_offset(self.text, span.start))
    }

    /// Where an error about the value of `entry` points: the value in TOML,
    /// the key in JSON.
    pub(crate) fn value_loc(&self, entry: &Entry) -> Option<Location> {
        match self.format {
            Format::Toml => self.loc(&entry.value.span),
            Format::Json => self.loc(&entry.key_span),
        }
    }

    /// The raw text of a span (empty when the span is not in the text).
    pub(crate) fn raw(&self, span: &Range<usize>) -> &str {
        self.text.get(span.clone()).unwrap_or("")
    }

    /// What a value is, for "found ..." in messages: the type, and for a
    /// scalar its value (`string "5"`, `float 4.5`, `number 4.5`, `boolean true`).
    pub(crate) fn found(&self, node: &Node) -> String {
        let value = match &node.value {
            Value::Str(s) => match self.format {
                Format::Toml => format!("\"{s}\""),
                Format::Json => serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\"")),
            },
            Value::Int(_) | Value::Float(_) => self.number_text(node),
            Value::Bool(b) => b.to_string(),
            _ => return node.type_word(self.format).to_string(),
        };
        format!("{} {}", node.type_word(self.format), shorten(value, 40))
    }

    /// A number as shown in messages: as written.
    pub(crate) fn number_text(&self, node: &Node) -> String {
        self.raw(&node.span).trim().to_string()
    }

    /// A parameter value that failed validation, for "`path` = value":
    /// TOML as written; JSON as read (`2.0` read as `2`) unless reading it
    /// changed the number (`0.99999999` read as f32 is `1`) or made it
    /// longer (`1e-45`): then as written.
    pub(crate) fn shown(&self, node: &Node, as_read: &str) -> String {
        let written = self.written(node);
        match (self.format, node.as_f64(), as_read.parse::<f64>()) {
            (Format::Json, Some(w), Ok(r)) if w == r && as_read.len() < written.len() => {
                as_read.to_string()
            }
            (Format::Json, None, _) => as_read.to_string(),
            _ => written,
        }
    }

    /// A value as written, for "`path` = value is out of range" (shortened
    /// if long).
    pub(crate) fn written(&self, node: &Node) -> String {
        let raw = match (&node.value, self.format) {
            (Value::Str(s), Format::Json) => {
                serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
            }
            _ => self.raw(&node.span).trim().to_string(),
        };
        shorten(raw, 60)
    }
}

/// Parse a TOML document into a located tree.
///
/// # Errors
/// [`ConfigError::Syntax`] with toml's message and location, or, for a key
/// defined twice, with the key's full path; [`ConfigError::DuplicateStage`]
/// for a stage table header given twice (`table_is_stage` says which
/// top-level names are stage tables).
pub(crate) fn parse_toml<'a>(
    text: &'a str,
    table_is_stage: impl Fn(&str) -> Option<&'static str>,
) -> Result<(Doc<'a>, Node), ConfigError> {
    let doc = Doc {
        text,
        format: Format::Toml,
    };
    let (root, errors) = DeTable::parse_recoverable(text);
    let root = Node {
        span: 0..text.len(),
        value: Value::Table(toml_table(root.get_ref())),
    };
    let Some(first) = errors.first() else {
        return Ok((doc, root));
    };
    let location = first.span().map(|s| Location::from_offset(text, s.start));
    // An error at a key that the document defines before it: that key is
    // defined twice (a table header given twice, a key repeated in a table,
    // a dotted key over a table). Found from the tree, not from the message.
    if let Some(span) = first.span()
        && is_key_position(text, &span)
        && let Some(name) = key_name(doc.raw(&span))
        && let Some((path, value)) =
            written_key(&root, text, &span, &name).or_else(|| earlier_key(&root, &name, span.start))
    {
        if let (Some(stage), Value::Table(_)) = (table_is_stage(&path), &value.value) {
            return Err(ConfigError::DuplicateStage {
                stage,
                first: path.clone(),
                second: path,
                location,
            });
        }
        return Err(ConfigError::Syntax {
            format: "TOML",
            message: format!("duplicate key `{path}`: each key may be given once per table"),
            location,
        });
    }
    Err(ConfigError::Syntax {
        format: "TOML",
        message: first.message().trim().to_string(),
        location,
    })
}

/// Whether `span` is where a key is written: followed by `=`, `.` or (in a
/// `[table]` header) `]`, and not preceded by `=` (a value).
fn is_key_position(text: &str, span: &Range<usize>) -> bool {
    let after = text
        .get(span.end..)
        .and_then(|r| r.trim_start_matches([' ', '\t']).chars().next());
    let before_text = text.get(..span.start).unwrap_or("");
    let before = before_text
        .trim_end_matches([' ', '\t'])
        .chars()
        .next_back();
    let line = &before_text[before_text.rfind('\n').map_or(0, |i| i + 1)..];
    match after {
        Some('=' | '.') => before != Some('='),
        Some(']') => line.trim_start().starts_with('['),
        _ => false,
    }
}

/// One step of a key path.
enum Seg {
    Key(String),
    Index(usize),
}

/// The full path of the key written at `span` (its dotted prefix on the
/// line, under the nearest `[table]` / `[[array]]` header above it), when
/// the tree has it: `(path, value)`. `None` for keys inside inline tables.
fn written_key<'n>(
    root: &'n Node,
    text: &str,
    span: &Range<usize>,
    name: &str,
) -> Option<(String, &'n Node)> {
    let before = text.get(..span.start)?;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let prefix = before[line_start..].trim_start();
    let dotted = |s: &str| -> Option<Vec<String>> {
        s.split('.')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(key_name)
            .collect()
    };
    let mut segs: Vec<Seg> = Vec::new();
    if let Some(header) = prefix.strip_prefix('[') {
        let header = header.strip_prefix('[').unwrap_or(header);
        segs.extend(dotted(header)?.into_iter().map(Seg::Key));
    } else {
        if prefix.contains(['=', '{', '[', ',']) {
            return None;
        }
        // The nearest header above: `[a.b]`, or `[[a]]` (its entry index).
        let lines: Vec<&str> = before[..line_start].lines().collect();
        if let Some(pos) = lines.iter().rposition(|l| l.trim_start().starts_with('[')) {
            let h = lines[pos].trim();
            if let Some(inner) = h.strip_prefix("[[").and_then(|r| r.split_once("]]")) {
                let parts = dotted(inner.0)?;
                let same = |l: &&str| {
                    l.trim()
                        .strip_prefix("[[")
                        .and_then(|r| r.split_once("]]"))
                        .is_some_and(|(n, _)| dotted(n).as_ref() == Some(&parts))
                };
                let index = lines[..=pos]
                    .iter()
                    .filter(|l| same(l))
                    .count()
                    .saturating_sub(1);
                segs.extend(parts.into_iter().map(Seg::Key));
                segs.push(Seg::Index(index));
            } else if let Some(inner) = h.strip_prefix('[').and_then(|r| r.split_once(']')) {
                segs.extend(dotted(inner.0)?.into_iter().map(Seg::Key));
            }
        }
        segs.extend(dotted(prefix)?.into_iter().map(Seg::Key));
    }
    segs.push(Seg::Key(name.to_string()));
    let mut node = root;
    let mut path = String::new();
    for seg in &segs {
        match seg {
            Seg::Key(k) => {
                node = &node.get(k)?.value;
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
            }
            Seg::Index(i) => {
                let Value::Array(items) = &node.value else {
                    return None;
                };
                node = items.get(*i)?;
                path.push_str(&format!("[{i}]"));
            }
        }
    }
    Some((path, node))
}

/// The name a key's text stands for: bare, or a quoted key without escapes.
fn key_name(raw: &str) -> Option<String> {
    let raw = raw.trim();
    if raw.is_empty() {
        return None;
    }
    for q in ['"', '\''] {
        if let Some(inner) = raw.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            return (!inner.contains('\\')).then(|| inner.to_string());
        }
    }
    raw.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        .then(|| raw.to_string())
}

/// The last key called `name` whose span starts before `before`, anywhere
/// in the tree, with its key path (`top_k.k`, `stage[0].type`).
fn earlier_key<'n>(root: &'n Node, name: &str, before: usize) -> Option<(String, &'n Node)> {
    fn walk<'n>(
        node: &'n Node,
        path: &str,
        name: &str,
        before: usize,
        best: &mut Option<(usize, String, &'n Node)>,
    ) {
        match &node.value {
            Value::Table(entries) => {
                for e in entries {
                    let p = if path.is_empty() {
                        e.key.clone()
                    } else {
                        format!("{path}.{}", e.key)
                    };
                    // A table header given twice: toml keeps the table
                    // under the second header's key (at `before` itself).
                    let earlier = e.key_span.start < before
                        || (e.key_span.start == before && matches!(e.value.value, Value::Table(_)));
                    if e.key == name
                        && earlier
                        && best
                            .as_ref()
                            .is_none_or(|(at, _, _)| e.key_span.start > *at)
                    {
                        *best = Some((e.key_span.start, p.clone(), &e.value));
                    }
                    walk(&e.value, &p, name, before, best);
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{path}[{i}]"), name, before, best);
                }
            }
            _ => {}
        }
    }
    let mut best = None;
    walk(root, "", name, before, &mut best);
    best.map(|(_, path, node)| (path, node))
}

fn toml_table(t: &DeTable<'_>) -> Vec<Entry> {
    t.iter()
        .map(|(k, v)| Entry {
            key: k.get_ref().to_string(),
            key_span: k.span(),
            value: toml_node(v),
        })
        .collect()
}

fn toml_node(v: &Spanned<DeValue<'_>>) -> Node {
    let value = match v.get_ref() {
        DeValue::String(s) => Value::Str(s.to_string()),
        // TOML integers are 64-bit (the spec): every reader refuses one
        // beyond i64 as out of range (one beyond i128 reads as i128::MAX).
        DeValue::Integer(i) => {
            Value::Int(i128::from_str_radix(i.as_str(), i.radix()).unwrap_or(i128::MAX))
        }
        DeValue::Float(f) => Value::Float(f.as_str().replace('_', "")),
        DeValue::Boolean(b) => Value::Bool(*b),
        DeValue::Datetime(_) => Value::Datetime,
        DeValue::Array(items) => Value::Array(items.iter().map(toml_node).collect()),
        DeValue::Table(t) => Value::Table(toml_table(t)),
    };
    Node {
        value,
        span: v.span(),
    }
}

/// Parse a JSON document into a located tree. Syntax errors are
/// serde_json's (message and location); then the document is read with
/// jsonc-parser in strict JSON mode (no comments, no trailing commas) for
/// the spans.
///
/// # Errors
/// [`ConfigError::Syntax`]; [`ConfigError::DuplicateKey`] for a key given
/// twice in one object, with its full path (`stages[1].k`) and the
/// location of the second one.
pub(crate) fn parse_json(text: &str) -> Result<(Doc<'_>, Node), ConfigError> {
    // A byte-order mark (Windows editors write one) is not JSON: skip it.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let doc = Doc {
        text,
        format: Format::Json,
    };
    serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(|e| schema_error(text, &e))?;
    let options = jsonc_parser::ParseOptions {
        allow_comments: false,
        allow_loose_object_property_names: false,
        allow_trailing_commas: false,
        ..Default::default()
    };
    let parsed =
        jsonc_parser::parse_to_ast(text, &jsonc_parser::CollectOptions::default(), &options)
            .map_err(|e| ConfigError::Syntax {
                format: "JSON",
                message: e.kind().to_string(),
                location: Some(Location::from_offset(text, e.range().start)),
            })?;
    let Some(value) = parsed.value else {
        return Err(ConfigError::Syntax {
            format: "JSON",
            message: "EOF while parsing a value".into(),
            location: Some(Location::from_offset(text, text.len())),
        });
    };
    let root = json_node(&doc, &value, "")?;
    Ok((doc, root))
}

fn json_node(doc: &Doc<'_>, v: &ast::Value<'_>, path: &str) -> Result<Node, ConfigError> {
    let r = v.range();
    let span = r.start..r.end;
    let value = match v {
        ast::Value::NullKeyword(_) => Value::Null,
        ast::Value::BooleanLit(b) => Value::Bool(b.value),
        ast::Value::StringLit(s) => Value::Str(s.value.to_string()),
        ast::Value::NumberLit(n) => {
            let text: &str = n.value;
            if text.contains(['.', 'e', 'E']) {
                Value::Float(text.to_string())
            } else {
                match text.parse::<i128>() {
                    Ok(i) => Value::Int(i),
                    Err(_) => Value::Float(text.to_string()),
                }
            }
        }
        ast::Value::Array(a) => Value::Array(
            a.elements
                .iter()
                .enumerate()
                .map(|(i, item)| json_node(doc, item, &format!("{path}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        ast::Value::Object(o) => {
            let mut entries: Vec<Entry> = Vec::with_capacity(o.properties.len());
            // Keys seen so far: a set, not a scan of `entries` (a 16k-key
            // `logit_bias` object would be quadratic).
            let mut seen = std::collections::HashSet::with_capacity(o.properties.len());
            for prop in &o.properties {
                let (key, key_range) = match &prop.name {
                    ast::ObjectPropName::String(s) => (s.value.to_string(), s.range),
                    ast::ObjectPropName::Word(w) => (w.value.to_string(), w.range),
                };
                let key_span = key_range.start..key_range.end;
                let kpath = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                if !seen.insert(key.clone()) {
                    return Err(ConfigError::DuplicateKey {
                        path: kpath.clone(),
                        other: kpath,
                        location: doc.loc(&key_span),
                    });
                }
                let value = json_node(doc, &prop.value, &kpath)?;
                entries.push(Entry {
                    key,
                    key_span,
                    value,
                });
            }
            Value::Table(entries)
        }
    };
    Ok(Node { value, span })
}
