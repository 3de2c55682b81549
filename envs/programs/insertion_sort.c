/* Insertion sort and a check that the result is ordered, on a pseudo-random array. */
static unsigned int state = 12345u;

static unsigned int next_random(void) {
    state = state * 1103515245u + 12345u;
    return (state >> 16) & 0x7FFFu;
}

static void insertion_sort(int *v, int n) {
    for (int i = 1; i < n; i++) {
        int key = v[i];
        int j = i - 1;
        while (j >= 0 && v[j] > key) {
            v[j + 1] = v[j];
            j--;
        }
        v[j + 1] = key;
    }
}

static int is_sorted(const int *v, int n) {
    for (int i = 1; i < n; i++)
        if (v[i - 1] > v[i])
            return 0;
    return 1;
}

int main(void) {
    int v[64];
    for (int i = 0; i < 64; i++)
        v[i] = (int)(next_random() % 1000u);
    insertion_sort(v, 64);
    return is_sorted(v, 64) ? v[0] : -1;
}
