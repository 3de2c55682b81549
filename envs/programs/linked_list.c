/* A singly linked list in a static node pool: push, reverse, remove by value and sum. */
struct node {
    int value;
    struct node *next;
};

static struct node pool[64];
static int used;

static struct node *push(struct node *head, int value) {
    struct node *n = &pool[used++];
    n->value = value;
    n->next = head;
    return n;
}

static struct node *reverse(struct node *head) {
    struct node *prev = 0;
    while (head) {
        struct node *next = head->next;
        head->next = prev;
        prev = head;
        head = next;
    }
    return prev;
}

static struct node *remove_value(struct node *head, int value) {
    struct node **link = &head;
    while (*link) {
        if ((*link)->value == value)
            *link = (*link)->next;
        else
            link = &(*link)->next;
    }
    return head;
}

static int sum(const struct node *head) {
    int s = 0;
    for (; head; head = head->next)
        s += head->value;
    return s;
}

int main(void) {
    struct node *list = 0;
    for (int i = 0; i < 40; i++)
        list = push(list, i % 9);
    list = reverse(list);
    list = remove_value(list, 4);
    return sum(list) + (list ? list->value : 0);
}
