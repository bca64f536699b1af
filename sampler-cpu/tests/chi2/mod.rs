//! Pearson's chi-square goodness of fit for the statistical tests: the
//! upper tail from the regularised incomplete gamma function, categories
//! with an expected count below 5 pooled.

#![allow(dead_code)]

/// ln Γ(x) for x > 0 (Lanczos approximation, g = 7, 9 terms; |error| < 1e-13).
pub fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection.
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + G + 0.5;
    for (i, &c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Regularised upper incomplete gamma Q(s, x) = Γ(s, x) / Γ(s): a series for
/// x < s + 1, a Lentz continued fraction otherwise.
pub fn gamma_q(s: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let ln_pre = s * x.ln() - x - ln_gamma(s);
    if x < s + 1.0 {
        // P(s, x) = e^-x x^s / Γ(s+1) · Σ x^n / ((s+1)...(s+n)).
        let (mut term, mut sum, mut a) = (1.0 / s, 1.0 / s, s);
        for _ in 0..10_000 {
            a += 1.0;
            term *= x / a;
            sum += term;
            if term.abs() < sum.abs() * 1e-16 {
                break;
            }
        }
        1.0 - sum * ln_pre.exp()
    } else {
        let tiny = 1e-300;
        let mut b = x + 1.0 - s;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - s);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        ln_pre.exp() * h
    }
}

/// Upper-tail p-value of a chi-square statistic with `df` degrees of freedom.
pub fn chi2_sf(stat: f64, df: usize) -> f64 {
    gamma_q(df as f64 / 2.0, stat / 2.0)
}

/// Pearson chi-square p-value of `counts` against probabilities `expected`
/// (pooling categories with expected count < 5; zero-probability ones dropped).
pub fn p_value(counts: &[usize], expected: &[f64]) -> f64 {
    let n = counts.iter().sum::<usize>() as f64;
    let mut cats: Vec<(f64, f64)> = Vec::new(); // (observed, expected)
    let mut pool = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(expected) {
        if p <= 0.0 {
            continue;
        }
        let e = p * n;
        if e < 5.0 {
            pool.0 += c as f64;
            pool.1 += e;
        } else {
            cats.push((c as f64, e));
        }
    }
    if pool.1 > 0.0 {
        if pool.1 >= 5.0 || cats.is_empty() {
            cats.push(pool);
        } else if let Some(last) = cats.last_mut() {
            last.0 += pool.0;
            last.1 += pool.1;
        }
    }
    if cats.len() < 2 {
        return 1.0; // a single category fits trivially
    }
    let stat: f64 = cats.iter().map(|&(o, e)| (o - e) * (o - e) / e).sum();
    chi2_sf(stat, cats.len() - 1)
}
