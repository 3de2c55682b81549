/* Sieve of Eratosthenes, then the sum and count of the primes and the largest prime gap. */
#define LIMIT 2000

static unsigned char composite[LIMIT + 1];

int main(void) {
    for (int i = 2; i * i <= LIMIT; i++)
        if (!composite[i])
            for (int j = i * i; j <= LIMIT; j += i)
                composite[j] = 1;
    int count = 0, last = 2, gap = 0;
    long sum = 0;
    for (int i = 2; i <= LIMIT; i++) {
        if (composite[i])
            continue;
        count++;
        sum += i;
        if (i - last > gap)
            gap = i - last;
        last = i;
    }
    return (int)((sum + count + gap) & 0xFF);
}
