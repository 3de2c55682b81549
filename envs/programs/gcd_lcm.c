/* Integer arithmetic: Euclid's gcd, lcm, modular exponentiation and an integer square root. */
static unsigned long gcd(unsigned long a, unsigned long b) {
    while (b) {
        unsigned long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static unsigned long lcm(unsigned long a, unsigned long b) {
    return a / gcd(a, b) * b;
}

static unsigned long power_mod(unsigned long base, unsigned long exp, unsigned long mod) {
    unsigned long result = 1;
    base %= mod;
    while (exp) {
        if (exp & 1)
            result = result * base % mod;
        base = base * base % mod;
        exp >>= 1;
    }
    return result;
}

static unsigned long isqrt(unsigned long n) {
    unsigned long x = n, y = (x + 1) / 2;
    while (y < x) {
        x = y;
        y = (x + n / x) / 2;
    }
    return x;
}

int main(void) {
    unsigned long acc = 1;
    for (unsigned long i = 1; i <= 20; i++)
        acc = lcm(acc, i);
    return (int)((acc + power_mod(7, 560, 561) + isqrt(acc)) % 251);
}
