/* Binary search, lower bound and a count of hits over a sorted table built in place. */
static int table[256];

static int binary_search(const int *v, int n, int key) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (v[mid] == key)
            return mid;
        if (v[mid] < key)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

static int lower_bound(const int *v, int n, int key) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v[mid] < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int main(void) {
    for (int i = 0; i < 256; i++)
        table[i] = 3 * i + (i & 1);
    int hits = 0;
    for (int key = 0; key < 800; key += 7)
        if (binary_search(table, 256, key) >= 0)
            hits++;
    return hits + lower_bound(table, 256, 400);
}
