//! Symbolic dimensions. Every dimension of a step is linear in the step's token count `T`
//! and its count of logit rows `O`: `c + t*T + o*O`. Graph files write them as expressions
//! over integers, `T`, `O` and the graph's named constants (`"head_dim*n_head"`, `"T"`), with
//! `+` and `*`; a product of two non-constant terms is refused (it would not be linear).

use std::collections::BTreeMap;

use super::error::DimError;

/// `c + t*T + o*O`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Lin {
    pub c: i64,
    pub t: i64,
    pub o: i64,
}

impl Lin {
    pub const fn k(c: i64) -> Lin {
        Lin { c, t: 0, o: 0 }
    }
    pub const T: Lin = Lin { c: 0, t: 1, o: 0 };
    pub const O: Lin = Lin { c: 0, t: 0, o: 1 };

    /// The value at `T = t`, `O = o` (programs bound their dims at compile time; wrapping
    /// keeps a hostile value from panicking before the check refuses it).
    pub fn eval(self, t: i64, o: i64) -> i64 {
        self.c
            .wrapping_add(self.t.wrapping_mul(t))
            .wrapping_add(self.o.wrapping_mul(o))
    }

    pub fn is_const(self) -> bool {
        self.t == 0 && self.o == 0
    }

    fn add(self, b: Lin) -> Option<Lin> {
        Some(Lin {
            c: self.c.checked_add(b.c)?,
            t: self.t.checked_add(b.t)?,
            o: self.o.checked_add(b.o)?,
        })
    }

    fn mul(self, b: Lin) -> Option<Lin> {
        let (k, v) = if self.is_const() {
            (self.c, b)
        } else if b.is_const() {
            (b.c, self)
        } else {
            return None;
        };
        Some(Lin {
            c: v.c.checked_mul(k)?,
            t: v.t.checked_mul(k)?,
            o: v.o.checked_mul(k)?,
        })
    }

    /// The expression form graph files use.
    pub fn to_expr(self) -> String {
        let mut parts = Vec::new();
        if self.t != 0 {
            parts.push(if self.t == 1 {
                "T".to_string()
            } else {
                format!("{}*T", self.t)
            });
        }
        if self.o != 0 {
            parts.push(if self.o == 1 {
                "O".to_string()
            } else {
                format!("{}*O", self.o)
            });
        }
        if self.c != 0 || parts.is_empty() {
            parts.push(self.c.to_string());
        }
        parts.join("+")
    }
}

/// Parses a dimension expression. Errors say what is wrong with it.
pub fn parse(expr: &str, consts: &BTreeMap<String, i64>) -> Result<Lin, DimError> {
    if expr.len() > 256 {
        return Err(DimError::TooLong(expr.len()));
    }
    let mut sum = Lin::k(0);
    for term in expr.split('+') {
        let mut prod = Lin::k(1);
        for factor in term.split('*') {
            let f = factor.trim();
            let v = if f == "T" {
                Lin::T
            } else if f == "O" {
                Lin::O
            } else if let Ok(n) = f.parse::<i64>() {
                Lin::k(n)
            } else if let Some(&n) = consts.get(f) {
                Lin::k(n)
            } else if f.is_empty() {
                return Err(DimError::EmptyTerm(expr.into()));
            } else {
                return Err(DimError::UnknownName {
                    expr: expr.into(),
                    name: f.into(),
                });
            };
            prod = prod
                .mul(v)
                .ok_or_else(|| DimError::NotLinear(expr.into()))?;
        }
        sum = sum
            .add(prod)
            .ok_or_else(|| DimError::Overflow(expr.into()))?;
    }
    if sum.c < 0 || sum.t < 0 || sum.o < 0 {
        return Err(DimError::Negative(expr.into()));
    }
    Ok(sum)
}

/// A shape of up to four linear dimensions, ggml order.
pub type Shape = [Lin; 4];

pub fn eval_shape(s: &Shape, t: i64, o: i64) -> [i64; 4] {
    [
        s[0].eval(t, o),
        s[1].eval(t, o),
        s[2].eval(t, o),
        s[3].eval(t, o),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_linear_expressions_and_refuses_the_rest() {
        let mut c = BTreeMap::new();
        c.insert("head_dim".to_string(), 64);
        c.insert("n_head".to_string(), 9);
        assert_eq!(parse("head_dim*n_head", &c).unwrap(), Lin::k(576));
        assert_eq!(parse("T", &c).unwrap(), Lin::T);
        assert_eq!(parse(" 2*T + O + 3", &c).unwrap(), Lin { c: 3, t: 2, o: 1 });
        assert!(parse("T*O", &c).unwrap_err().to_string().contains("linear"));
        assert!(parse("n_embd", &c)
            .unwrap_err()
            .to_string()
            .contains("unknown name 'n_embd'"));
        assert!(parse("T+", &c).unwrap_err().to_string().contains("empty"));
        assert!(parse("-1", &c)
            .unwrap_err()
            .to_string()
            .contains("negative"));
        assert!(parse("9223372036854775807*2", &c)
            .unwrap_err()
            .to_string()
            .contains("overflows"));
        for l in [Lin::T, Lin::k(7), Lin { c: 3, t: 2, o: 1 }, Lin::O] {
            assert_eq!(parse(&l.to_expr(), &c).unwrap(), l);
        }
    }
}
