/* Recursive quicksort (Lomuto partition) with a median-of-three pivot. */
static void swap(int *x, int *y) {
    int t = *x;
    *x = *y;
    *y = t;
}

static int median3(int *v, int lo, int hi) {
    int mid = lo + (hi - lo) / 2;
    if (v[mid] < v[lo]) swap(&v[mid], &v[lo]);
    if (v[hi] < v[lo]) swap(&v[hi], &v[lo]);
    if (v[hi] < v[mid]) swap(&v[hi], &v[mid]);
    return mid;
}

static int partition(int *v, int lo, int hi) {
    swap(&v[median3(v, lo, hi)], &v[hi]);
    int pivot = v[hi], store = lo;
    for (int i = lo; i < hi; i++)
        if (v[i] < pivot)
            swap(&v[i], &v[store++]);
    swap(&v[store], &v[hi]);
    return store;
}

static void quicksort(int *v, int lo, int hi) {
    while (lo < hi) {
        int p = partition(v, lo, hi);
        if (p - lo < hi - p) {
            quicksort(v, lo, p - 1);
            lo = p + 1;
        } else {
            quicksort(v, p + 1, hi);
            hi = p - 1;
        }
    }
}

int main(void) {
    int v[100];
    for (int i = 0; i < 100; i++)
        v[i] = (i * 7919) % 101;
    quicksort(v, 0, 99);
    return v[50];
}
